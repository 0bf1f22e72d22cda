"""`agentgym sft MODEL OUT`: supervised fine-tuning as a command of its own.

Exactly one source of conversations per run:

- ``--env ENV`` plays the env's scripted turns, the data of the train stage's warm start
  (`sft_warm_start`);
- ``--trajectories FILE.jsonl`` trains on recorded episodes (``agentgym eval``'s
  ``trajectories.jsonl``, e.g. a stronger model's): rejection-sampling or distillation SFT.
  Only episodes that ended ``ok`` with enough reward are kept.

Every mistake (a file, the filter, the env, OUT, the model) is a `ConfigError` raised before
the weights load and before OUT is made; the CLI prints it as one line and exits 2. Nothing
optional is imported at the top, so ``agentgym --help`` lists the command on a base install.

A killed run resumes from its checkpoint in ``OUT.partial/`` when run again with the same
options; ``--resume`` also accepts the OUT the killed run left (a queued job's folder, its
``output.log``). `check_options` is the part of the checks a job queue runs at submission.

The run is indexed in the run store (`agentgym.runs.track_run`, kind ``sft``) once the
command's own checks pass, as ``agentgym eval`` is: a refused command line never becomes a row;
a refusal of the training itself (a trace too long, another run's checkpoint) is a ``failed``
row with exit 2.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import re
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from agentgym._cli_common import (
    ChatTemplateKwargsOption,
    EnvArgOption,
    folder_path,
    key_value,
    parse_env_args,
    parse_template_kwargs,
)
from agentgym._durable import check_folder_can_be_made
from agentgym._errors import ConfigError
from agentgym._extras import needs_extra
from agentgym._registry import resolve_id
from agentgym._tasks import parse_tasks, tasks_of_env
from agentgym.runs._folder import (
    OUTPUT_LOG,
    SFT_SUMMARY,
    read_json,
    remove_spent_sft_checkpoint,
    sft_checkpoint,
)

from ._cli import _quiet_backends, console
from ._config_rules import SFT_VALIDATION_TASKS, split_off_validation
from ._health import diagnose
from ._recorded_episodes import eval_options, kept_conversations, played_settings
from ._sft import (
    EnvFacts,
    SFTConfig,
    check_device_here,
    dropped_text,
    env_facts,
    sft_on_conversations,
    sft_warm_start,
)

log = logging.getLogger(__name__)
#: Steps between validation measurements with ``--target-accuracy``.
SFT_EVAL_EVERY = 10


#: An `SFTConfig` field as its errors name it; each is this command's option of that name.
_SFT_FIELD = re.compile(r"SFTConfig\.(\w+)")


@contextlib.contextmanager
def _knobs_named_as_options() -> Iterator[None]:
    """Errors name a knob as the option that set it (``--batch-size``), not as `SFTConfig`'s.

    Why: the command's user never wrote the dataclass (``SFTConfig.batch_size``).
    """
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(_SFT_FIELD.sub(lambda m: "--" + m[1].replace("_", "-"), str(exc))) \
            from None  # fmt: skip


class Method(StrEnum):
    """What SFT trains (`SFTConfig.method`)."""

    full = "full"
    lora = "lora"


@_knobs_named_as_options()
def sft(
    model: Annotated[
        str, typer.Argument(help="A model folder with a chat template, or tiny / tiny:PRESET.")
    ],
    out: Annotated[
        Path, typer.Argument(help="A new folder for the fine-tuned model.", parser=folder_path)
    ],
    env: Annotated[str | None, typer.Option(help="Source: play this env's scripted turns.")] = None,
    trajectories: Annotated[
        list[Path] | None,
        typer.Option(
            "--trajectories",
            help="Source: a JSONL file of recorded episodes, as agentgym eval writes them "
            "(repeatable).",
        ),
    ] = None,
    tasks: Annotated[
        str | None, typer.Option(help="--env: task indices START:END (default: all).")
    ] = None,
    script: Annotated[
        list[str] | None,
        typer.Option(
            "--script",
            help="--env: NAME=SHARE, the share of tasks played by the env's NAME_turns "
            "(repeatable; default reference=1).",
        ),
    ] = None,
    min_reward: Annotated[
        float | None,
        typer.Option(
            help="--trajectories: keep episodes with final_reward >= this (default: > 0)."
        ),
    ] = None,
    target_accuracy: Annotated[
        float | None,
        typer.Option(
            help=f"Stop once this share of validation traces is carried out token for token "
            f"(teacher forced), measured every {SFT_EVAL_EVERY} steps on the last "
            f"{SFT_VALIDATION_TASKS} of --tasks (--env; as train's sft_target_accuracy) or at "
            f"least {SFT_VALIDATION_TASKS} kept episodes of the last tasks (--trajectories), "
            "kept out of the traces."
        ),
    ] = None,
    steps: Annotated[int, typer.Option(help="Optimiser steps.")] = SFTConfig.steps,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW).")] = SFTConfig.lr,
    batch_size: Annotated[int, typer.Option(help="Conversations per step.")] = SFTConfig.batch_size,
    seed: Annotated[
        int, typer.Option(help="Data order, adapter init, tiny model.")
    ] = SFTConfig.seed,
    method: Annotated[
        Method, typer.Option(help="full: every weight; lora: an adapter, merged on save.")
    ] = Method.full,
    lora_rank: Annotated[int, typer.Option(help="Adapter rank (lora).")] = SFTConfig.lora_rank,
    save_every: Annotated[
        int,
        typer.Option(
            help="Steps between checkpoints in OUT.partial/: run the same command "
            "again after a kill to resume there (0: none)."
        ),
    ] = SFTConfig.save_every,
    device: Annotated[
        str, typer.Option(help="Where to train: cpu, cuda, cuda:1 ...")
    ] = SFTConfig.device,
    max_length: Annotated[
        int | None,
        typer.Option(help="Longest conversation in tokens (default: the model's context)."),
    ] = None,
    chat_template_kwargs: ChatTemplateKwargsOption = None,
    env_arg: EnvArgOption = [],  # noqa: B006
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue a killed run into OUT: OUT may hold what it left (not a finished "
            "model); training goes on from OUT.partial/ (from step 0 without a checkpoint).",
        ),
    ] = False,
) -> None:
    """Fine-tune a model on an env's scripted turns or on recorded trajectories (SFT).

    The result is a plain model folder: use it as `model:` in a train config, or evaluate it
    with `agentgym eval ENV --policy vllm --model-path OUT`.
    """
    _quiet_backends()
    out = out.expanduser()  # `OUT=~/x` reaches us unexpanded from configs and `a=~/x` forms
    progress = _Progress(steps)
    config = _sft_config(
        steps=steps, lr=lr, batch_size=batch_size, seed=seed, method=method,
        lora_rank=lora_rank, max_length=max_length, save_every=save_every, device=device,
        target_accuracy=target_accuracy, log=progress,
    )  # fmt: skip
    if _check_out(out, resume, config) == "finished":
        return
    env_kwargs = parse_env_args(env_arg)
    template_kwargs = (
        parse_template_kwargs(chat_template_kwargs) if chat_template_kwargs is not None else None
    )
    _check_one_source(env, trajectories or [], tasks, script, min_reward)
    if env is not None:
        plan = _env_plan(model, resolve_id(env), env_kwargs, tasks, script or [], out, config,
                         template_kwargs or {})  # fmt: skip
    else:
        plan = _trajectories_plan(model, trajectories or [], min_reward, env_kwargs, out,
                                  config, template_kwargs)  # fmt: skip
    from agentgym.runs import track_run  # indexes the run; a database failure is only a warning

    with track_run("sft", out.resolve().name, _run_config(plan, config), out):
        with needs_extra("agentgym sft", "train"):
            try:
                folder = plan.train()
            except KeyboardInterrupt:  # Ctrl-C or `kill`: still exits 130 / 143, filed as such
                console.print(_interrupted(out, progress.step), soft_wrap=True)
                raise
        # inside the tracked block, as eval: a follower of the run's log stops once finished
        _print_figures(folder, env)


@dataclass(frozen=True)
class _Plan:
    """A checked SFT run: the model and source as resolved, and the training that writes OUT.

    Why: the command's checks all run before the run store gets a row, so a refused command
    line leaves none; only ``train`` runs inside `track_run`.
    """

    model_dir: Path
    settings: dict[str, Any]
    """The source's settings, as the run's row records them (``env``, ``tasks`` ...)."""
    train: Callable[[], Path]


def _run_config(plan: _Plan, config: SFTConfig) -> dict[str, Any]:
    """The row's config: what `agentgym runs compare` sets side by side with another run's."""
    knobs = {k: v for k, v in asdict(config).items() if k != "log"}  # log: a callable
    return {"model": str(plan.model_dir), **plan.settings, **knobs}


@_knobs_named_as_options()
def check_options(params: Mapping[str, Any]) -> None:
    """The command's refusals that need neither the model nor OUT, on its parsed options.

    Why: a queued sft job (``agentgym serve``, ``sweep``) is checked at submission, so a config
    the command would refuse never becomes a run; the model and the env's task count are the
    worker's to check (a model load), and the env is the caller's (a ``module:id`` runs the
    submitter's code on import: the job API checks it in a child process). ``params``: the
    command's click ``ctx.params``.
    """
    _sft_config(**params)
    env, tasks, scripts = params["env"], params["tasks"], params["script"]
    _check_one_source(env, params["trajectories"] or [], tasks, scripts, params["min_reward"])
    parse_env_args(params["env_arg"])
    if params["chat_template_kwargs"] is not None:
        parse_template_kwargs(params["chat_template_kwargs"])
    if tasks:
        parse_tasks(tasks, "--tasks")
    _parse_scripts(scripts or [])


def _sft_config(
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    method: Method | str,
    lora_rank: int,
    max_length: int | None,
    save_every: int,
    device: str,
    target_accuracy: float | None,
    log: Callable[[dict[str, Any]], None] | None = None,
    **_: Any,
) -> SFTConfig:
    """The knobs the options give (``**_``: the command's other options, for `check_options`)."""
    return SFTConfig(
        steps=steps, lr=lr, batch_size=batch_size, seed=seed, method=Method(method).value,
        lora_rank=lora_rank, max_length=max_length, save_every=save_every, device=device,
        log=log, target_accuracy=target_accuracy,
        eval_every=SFT_EVAL_EVERY if target_accuracy is not None else 0,
    )  # fmt: skip


#: The knobs that make another model (not where it trains or how often it saves).
_MODEL_KNOBS = ("steps", "lr", "batch_size", "seed", "method", "lora_rank", "max_length",
                "target_accuracy")  # fmt: skip


def _refuse_other_settings(out: Path, config: SFTConfig) -> None:
    """Refuse ``--resume`` of a finished model with other knobs: it would train nothing.

    Why: ``--resume --steps 2000`` of a 500-step model said "nothing to resume" and exited 0
    with the 500-step model; ``agentgym train --resume`` refuses a changed config the same way.
    """
    saved = (read_json(out / SFT_SUMMARY) or {}).get("config") or {}
    now = asdict(config)
    differ = [f"SFTConfig.{k} (saved {saved[k]!r}, now {now[k]!r})"
              for k in _MODEL_KNOBS if k in saved and saved[k] != now[k]]  # fmt: skip
    if differ:
        raise ConfigError(
            f"OUT {out} holds a finished model of other settings: {'; '.join(differ)}; pick a "
            "new OUT to train with these (--resume continues a killed run of the same ones)"
        )


def _check_out(out: Path, resume: bool, config: SFTConfig) -> Literal["finished"] | None:
    """OUT must be new (or an empty folder): a model folder mixed with old files misleads.

    A queue's ``output.log`` does not count: a queued job's OUT is its run folder, and the
    queue opens the log there before the command starts. With ``resume``, what a killed run
    left counts neither; a finished model (``sft.json``) is "finished": nothing to resume, as
    ``agentgym train --resume`` of a finished run says. Its checkpoint, if a kill came between
    the model's save and the checkpoint's removal, is spent: removed. (A queue resumed such a
    job, as it had a checkpoint, and the refusal that followed made a finished job ``failed``.)
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"OUT {out} already exists and is not a folder; pick a new folder")
    held = {p.name for p in out.iterdir()} - {OUTPUT_LOG} if out.is_dir() else set()
    if resume and SFT_SUMMARY in held:
        _refuse_other_settings(out, config)
        remove_spent_sft_checkpoint(out)
        console.print(f"OUT {out} holds a finished model ({SFT_SUMMARY}): nothing to resume",
                      soft_wrap=True)  # fmt: skip
        return "finished"
    if held and not resume:
        raise ConfigError(f"OUT {out} already exists and is not empty; pick a new folder (or "
                          "--resume to continue a killed run into it)")  # fmt: skip
    check_folder_can_be_made(out, "OUT")
    return None


def _check_one_source(
    env: str | None,
    trajectories: Sequence[Path],
    tasks: str | None,
    scripts: Sequence[str] | None,
    min_reward: float | None,
) -> None:
    """Exactly one source, and only the options of the source given."""
    if (env is None) == (not trajectories):
        given = "both" if env is not None else "neither"
        raise ConfigError(
            f"got {given} of --env and --trajectories; give exactly one: --env ENV (its "
            "scripted turns) or --trajectories FILE.jsonl (recorded episodes)"
        )
    if env is not None and min_reward is not None:
        raise ConfigError("--min-reward filters --trajectories; with --env drop it")
    if env is None and (tasks is not None or scripts):
        raise ConfigError("--tasks and --script choose what --env plays; with --trajectories "
                          "drop them")  # fmt: skip


def _env_plan(
    model: str,
    env_id: str,
    env_kwargs: dict[str, Any],
    tasks: str | None,
    scripts: Sequence[str],
    out: Path,
    config: SFTConfig,
    template_kwargs: dict[str, Any],
) -> _Plan:
    """The warm start's data and training, on the tasks and scripts the options chose."""
    facts = env_facts(env_id, env_kwargs)
    count = facts.size
    indices = tasks_of_env(tasks, env_id, count) if tasks else list(range(count))
    shares = _parse_scripts(scripts)
    validation: list[int] = []
    if config.target_accuracy is not None:
        indices, validation = split_off_validation(indices)
        if not indices:
            raise ConfigError(
                f"--target-accuracy holds back the last {SFT_VALIDATION_TASKS} of --tasks for "
                f"validation and there are {len(validation)}; give --tasks more than "
                f"{SFT_VALIDATION_TASKS} tasks (and the env more with --env-arg), or drop it"
            )
    model_dir = _checked_model(model, facts, template_kwargs, config.seed, config.device)
    train = functools.partial(
        sft_warm_start, model_dir, env_id, env_kwargs, out, config, tasks=indices,
        validation_tasks=validation, scripts=shares, chat_template_kwargs=template_kwargs,
    )  # fmt: skip
    settings = {"source": "env", "env": env_id, "env_kwargs": env_kwargs, "tasks": tasks,
                "scripts": shares, "chat_template_kwargs": template_kwargs}  # fmt: skip
    return _Plan(model_dir, settings, train)


def _trajectories_plan(
    model: str,
    paths: Sequence[Path],
    min_reward: float | None,
    env_kwargs: dict[str, Any],
    out: Path,
    config: SFTConfig,
    template_kwargs: dict[str, Any] | None,
) -> _Plan:
    """SFT on the recorded episodes the filter keeps, with the tools of the env they played.

    The env options and chat-template variables default to those the episodes were played
    with, read from the eval's ``run.json`` beside each file; given ones win. With a target
    accuracy, the kept episodes of the last tasks validate (`kept_conversations`).
    """
    hold_out = SFT_VALIDATION_TASKS if config.target_accuracy is not None else 0
    conversations, held_out, source = kept_conversations(paths, min_reward, hold_out)
    env_id = resolve_id(source["env_id"])
    played_env, played_template = played_settings(paths)
    env_kwargs = {**played_env, **env_kwargs}
    template_kwargs = played_template if template_kwargs is None else template_kwargs
    facts = env_facts(env_id, env_kwargs)
    source.update(env_id=env_id, env_kwargs=env_kwargs, chat_template_kwargs=template_kwargs)
    model_dir = _checked_model(model, facts, template_kwargs, config.seed, config.device)
    train = functools.partial(
        sft_on_conversations, model_dir, conversations, facts.tools, out, config,
        held_out=held_out, chat_template_kwargs=template_kwargs, source=source,
    )  # fmt: skip
    settings = {"source": "trajectories", "trajectories": [str(p) for p in paths],
                "min_reward": min_reward, "env": env_id, "env_kwargs": env_kwargs,
                "chat_template_kwargs": template_kwargs}  # fmt: skip
    return _Plan(model_dir, settings, train)


def _parse_scripts(pairs: Sequence[str]) -> dict[str, float]:
    """``--script NAME=SHARE`` pairs; none: the oracle alone."""
    shares: dict[str, float] = {}
    for pair in pairs:
        name, value = key_value(pair, "--script")
        try:
            shares[name] = float(value)
        except ValueError:
            shares[name] = math.nan  # refused below, with a number <= 0
        if not shares[name] > 0:
            raise ConfigError(f"--script {pair!r}: SHARE must be a number > 0, e.g. reference=0.3")
    return shares or {"reference": 1.0}


def _checked_model(
    model: str, env: EnvFacts, kwargs: dict[str, Any], seed: int, device: str
) -> Path:
    """The model folder, once its prompt shows the env's tools and its device is here.

    No weights load: the command's checks all end before the run store gets a row.
    """
    with needs_extra("agentgym sft", "train"):
        from ._preflight import _check_template, resolve_model

        model_dir = resolve_model(model, seed=seed)
        _check_template(model_dir, env.tools, kwargs, env.lists_tools)
        check_device_here(device)
    return model_dir


@dataclass
class _Progress:
    """A step logger for about ten lines a run: a long CPU run otherwise looks stuck.

    It keeps the last step trained, for the line a Ctrl-C prints.
    """

    steps: int
    step: int | None = None

    def __call__(self, record: dict[str, Any]) -> None:
        self.step = record["step"]
        if record["step"] % max(1, self.steps // 10) == 0:
            log.info("sft step %d/%d: loss %.4f", record["step"], self.steps, record["loss"])


def _interrupted(out: Path, step: int | None) -> str:
    """What a stopped run kept, and how to go on: the command stopped without a word."""
    at = f"interrupted at step {step}" if step is not None else "interrupted before a step"
    partial = sft_checkpoint(out)
    if partial.is_file():
        return f"{at}; run the same command to resume from {partial.parent}"
    return f"{at}, before its first checkpoint (--save-every); run the same command to start over"


def _print_figures(out: Path, env_as_given: str | None) -> None:
    """One line per figure of the ``sft.json`` just written, then how to use the model.

    The eval command names the env as the user gave it: the id it resolved to lost a user
    module's prefix (``units:probe/Units-v0``), and the pasted command then found no env.
    """
    summary = json.loads((out / "sft.json").read_text(encoding="utf-8"))
    env_id = env_as_given or summary["source"]["env_id"]
    history = summary["history"]
    console.print(f"traces used: {summary['num_examples']}")
    if dropped := dropped_text(summary["source"].get("dropped") or {}):
        console.print(f"traces dropped: {dropped}", soft_wrap=True)
    console.print(f"first loss: {history[0]['loss']:.4f}")
    console.print(f"last loss: {history[-1]['loss']:.4f}")
    measured = [r["reference_accuracy"] for r in history if "reference_accuracy" in r]
    if measured:
        target = summary["config"]["target_accuracy"]
        console.print(f"validation traces carried out: {measured[-1]:.0%} after {len(history)} "
                      f"steps (target {target:.0%})")  # fmt: skip
    for finding in diagnose([], warm_start=summary):  # docs/troubleshooting.md#<rule>
        console.print(f"health [{finding.rule}] {finding.text()}", soft_wrap=True)
    console.print(f"seconds: {summary['seconds']:.1f}")
    console.print(f"output folder: {out}", soft_wrap=True)
    console.print(
        f"use it as model: {out} in a train config, or evaluate it: agentgym eval {env_id} "
        f"--policy vllm --model-path {shlex.join([str(out), *eval_options(summary['source'])])}",
        soft_wrap=True,
    )
