"""The ``agentgym`` command: ``list``, ``check ENV``, ``eval ENV`` and ``sandbox ...``.

User mistakes (unknown env, bad option) print one line naming the fix and exit with code 2,
before anything is written; results are written atomically at the end of a run.

``eval --policy vllm`` samples with the in-process engine (`agentgym.engine.VLLMPolicy`, token
in / token out, no server; ``--policy hf``: `HFPolicy`, transformers, where vLLM is missing);
its rollout mode is decided on the same conversation that ``check --model`` reports on, so the
two agree.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table
from rich.text import Text

from ._check import check as run_checks
from ._check import load_tokenizer, reference_conversation, with_model_tokenizer
from ._check_template import unread_template_kwargs
from ._errors import ConfigError, Error, InfraError
from ._eval_folder import (
    TASKS_KEY,
    FolderLock,
    finished_summary,
    previous_episodes,
    remove_stale_writes,
    write_json,
)
from ._extras import needs_extra
from ._policies import OpenAIPolicy, Policy, ScriptedPolicy
from ._quick_exit import skip_final_collection
from ._registry import make, registered_envs, resolve_id
from ._rollout import rollout
from ._summary import summarize
from ._tasks import tasks_digest
from ._trajectory import Trajectory, to_json_line
from ._types import Message

app = typer.Typer(help="Multi-turn agentic RL environments for LLMs.", no_args_is_help=True)
#: Consoles that read no markup: what they print (templates, errors, paths) is the user's text,
#: and a '[/INST]' in it would otherwise be a markup error. Styles are `rich.text.Text`.
console = Console(stderr=True, markup=False)
stdout = Console(markup=False)


class PolicyKind(StrEnum):
    """Where assistant turns come from in `agentgym eval`."""

    reference = "reference"
    openai = "openai"
    vllm = "vllm"
    hf = "hf"

    @property
    def local(self) -> bool:
        """Samples from a local model folder (``--model-path``), token in / token out."""
        return self in (PolicyKind.vllm, PolicyKind.hf)


class RolloutModeChoice(StrEnum):
    """How `eval --policy vllm` builds prompts (see `agentgym.engine.ChatRenderer`)."""

    auto = "auto"  # concat where the chat template allows it, else per_turn
    concat = "concat"  # refuse a template that rewrites history
    per_turn = "per_turn"  # a fresh render every turn


def _parse_template_kwargs(text: str | None) -> dict[str, Any]:
    """``--chat-template-kwargs`` JSON as a dict (``'{"enable_thinking": false}'``)."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f'--chat-template-kwargs must be a JSON object, e.g. \'{{"enable_thinking": '
            f"false}}'; got {text!r} ({exc.msg})"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"--chat-template-kwargs must be a JSON object, got {text!r}")
    return value


#: Python's spellings of JSON's null, true and false: users type ``tool_timeout=None``, and
#: an option that takes a number or None refused the string 'None' (``'"None"'`` is that string).
_PYTHON_CONSTANTS: dict[str, Any] = {"None": None, "True": True, "False": False}


def _parse_env_args(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value is read as JSON or None/True/False, else kept a string."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env-arg expects key=value, got {pair!r}")
        if value in _PYTHON_CONSTANTS:
            kwargs[key] = _PYTHON_CONSTANTS[value]
            continue
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return kwargs


@app.command("list")
def list_envs() -> None:
    """List registered environments (one that cannot be built here says why)."""
    env_ids = registered_envs()
    table = Table(  # ids whole at any width: a user copies them into `make` and configs
        Column("id", no_wrap=True, min_width=max(map(len, env_ids), default=2)),
        Column("tools", overflow="fold"),
        "tasks",
        "description",
    )
    for env_id in env_ids:
        try:
            env = make(env_id)
        except Error as exc:  # a missing extra or service: the row says what to do
            table.add_row(env_id, "-", "-", Text(f"not available here: {exc}", style="yellow"))
            continue
        doc = (type(env).__doc__ or "").strip().splitlines()
        table.add_row(
            env_id,
            ", ".join(getattr(env, "tools", {})) or "-",
            str(len(getattr(env, "tasks", ()))),
            doc[0].replace("``", "`") if doc else "",  # reST literals as Markdown ones
        )
        env.close()
    stdout.print(table)


@app.command("check")
def check_env(
    env: Annotated[str, typer.Argument(help="Env id or short name, e.g. calculator.")],
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--model",
            "--tokenizer",
            help="Model (or tokenizer) folder: also check its chat template and report the "
            "rollout mode (concat / per_turn) the engine gives it.",
        ),
    ] = None,
    chat_template_kwargs: Annotated[
        str | None,
        typer.Option(help="Chat-template variables as JSON, e.g. '{\"enable_thinking\": false}'."),
    ] = None,
    env_arg: Annotated[list[str], typer.Option(help="Env option key=value (repeatable).")] = [],  # noqa: B006
) -> None:
    """Pre-flight an env: Gymnasium API, tool schemas, parser and chat-template round trips."""
    results = run_checks(
        resolve_id(env),
        tokenizer=tokenizer,
        chat_template_kwargs=_parse_template_kwargs(chat_template_kwargs),
        **_parse_env_args(env_arg),
    )
    table = Table("check", "result", "detail")
    styles = {"pass": "green", "skip": "yellow", "FAIL": "red"}
    for r in results:
        table.add_row(r.name, Text(r.verdict, style=styles[r.verdict]), r.detail)
    stdout.print(table)
    for r in results:  # a failure's whole traceback, where a table cell would wrap it
        if r.trace:
            stdout.print(f"traceback of {r.name}:\n{r.trace}", soft_wrap=True, highlight=False)
    if not all(r.passed for r in results):
        raise typer.Exit(1)


@app.command("eval")
def evaluate(
    ctx: typer.Context,
    env: Annotated[str, typer.Argument(help="Env id or short name, e.g. calculator.")],
    policy: Annotated[
        PolicyKind,
        typer.Option(
            help="reference: the env's own solution; openai: a running server (--base-url, "
            "--model); vllm: --model-path in the in-process engine, token in / token out; "
            "hf: the same with transformers (no vLLM needed)."
        ),
    ] = PolicyKind.reference,
    model_path: Annotated[
        Path | None, typer.Option(help="Local model folder (vllm and hf policies).")
    ] = None,
    adapter: Annotated[
        Path | None,
        typer.Option(
            help="vllm, hf: a trained LoRA adapter to sample with: a run folder (its newest "
            "checkpoint), a checkpoint, or an adapter folder (agentgym export); --model-path "
            "defaults to the base it was trained on."
        ),
    ] = None,
    base_url: Annotated[
        str, typer.Option(help="openai: the server root (OpenAI-compatible).")
    ] = "http://127.0.0.1:8000/v1",
    model: Annotated[
        str | None,
        typer.Option(help="Served model name (openai; vllm with --server: default the folder's)."),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="OPENAI_API_KEY", help="openai: bearer token.")
    ] = None,
    temperature: Annotated[
        float, typer.Option(help="openai, vllm, hf: sampling temperature.")
    ] = 1.0,
    num_tasks: Annotated[
        int | None, typer.Option("--num-tasks", "-n", min=1, help="First N tasks; all if omitted.")
    ] = None,
    group_size: Annotated[
        int, typer.Option("--group-size", "-g", min=1, help="Episodes per task.")
    ] = 1,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="Episodes in flight at once (default: enough to fill it)."),
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, help="openai, vllm, hf: max new tokens per turn.")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Base seed of the episodes (and of vllm sampling: runs repeat).")
    ] = 0,
    chat_template_kwargs: Annotated[
        str | None,
        typer.Option(
            help="vllm, hf: chat-template variables as JSON, '{\"enable_thinking\": false}'."
        ),
    ] = None,
    rollout_mode: Annotated[
        RolloutModeChoice,
        typer.Option(help="vllm, hf: concat (one sequence per episode), per_turn, or auto."),
    ] = RolloutModeChoice.auto,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            min=16,
            help="vllm, hf: context window; a longer episode ends truncated. "
            "[default: 4096, or the model's positions if fewer]",
        ),
    ] = None,
    server: Annotated[
        list[str],
        typer.Option(
            help="vllm: a vLLM server to sample on instead of the in-process engine "
            "(repeatable; token ids in and out, episodes routed sticky)."
        ),
    ] = [],  # noqa: B006
    router_url: Annotated[
        str | None, typer.Option(help="vllm: a router before the --server URLs (vllm-router).")
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Folder for trajectories.jsonl, summary.json and run.json.")
    ] = Path("runs/eval"),
    resume: Annotated[
        bool, typer.Option(help="Continue a killed run in --out: play only missing episodes.")
    ] = False,
    env_arg: Annotated[list[str], typer.Option(help="Env option key=value (repeatable).")] = [],  # noqa: B006
) -> None:
    """Run evaluation episodes; stream one trajectory per line, then write a summary."""
    if policy.local:
        from .engine._quiet import quiet_backends

        quiet_backends()  # before vLLM is imported: its engine processes read it too
    env_id = resolve_id(env)
    env_kwargs = _parse_env_args(env_arg)
    template_kwargs = _parse_template_kwargs(chat_template_kwargs)
    check_policy_options(ctx)
    servers = _Servers(server, router_url, model)
    if adapter is not None:
        adapter, model_path = _trained_adapter(adapter, model_path, policy, servers)
    # what envs are built with: under vllm, a vllm:<name> parser reads the model's tokenizer
    env_kwargs_built = _with_model(model_path, env_kwargs, policy) if policy.local else env_kwargs
    if policy.local and model_path is not None:  # checked before any engine starts
        from .engine._model_dir import context_length

        max_model_len = context_length(model_path, max_model_len)
    probe = make(env_id, **env_kwargs_built)  # validates options before any work
    tasks = getattr(probe, "tasks", ())
    total = len(tasks) if num_tasks is None else min(num_tasks, len(tasks))
    digest = tasks_digest(tasks, range(total))  # the first `total` tasks are played
    try:
        reference = _reference_turns(probe, tasks) if policy is PolicyKind.reference else None
    finally:
        probe.close()
    run_config = {
        "env": env_id, "env_kwargs": env_kwargs, "policy": policy.value,
        "model": str(model_path) if policy.local else model,
        "temperature": temperature, "num_tasks": num_tasks, "group_size": group_size,
        "seed": seed, "max_tokens": max_tokens, "chat_template_kwargs": template_kwargs,
        "rollout_mode": rollout_mode.value, "max_model_len": max_model_len,
        TASKS_KEY: digest, **({"adapter": str(adapter)} if adapter else {}),
    }  # fmt: skip
    from .runs import track_run  # indexes the run; a database failure is only a warning

    with contextlib.ExitStack() as stack:
        lock = stack.enter_context(FolderLock(out, warn=console.print))
        lock.acquire()  # before reading what is there: no second writer appends next to us
        done = previous_episodes(out, run_config, resume)
        stack.enter_context(track_run("eval", out.name, run_config, out))
        finished = finished_summary(out, len(done), total * group_size)
        if finished is not None:  # resumed with nothing left to play: start no engine
            _print_summary(finished, out)
            return
        agent: Policy
        if policy is PolicyKind.reference:
            assert reference is not None  # checked above; narrows the type
            agent = ScriptedPolicy(reference)
        elif policy.local and model_path is not None:
            sampling = {"temperature": temperature, "seed": seed, "max_tokens": max_tokens}
            engine = _prepare_engine(
                model_path, env_id, env_kwargs_built, sampling, template_kwargs, rollout_mode,
                max_model_len, servers, transformers=policy is PolicyKind.hf, adapter=adapter,
            )  # fmt: skip
            agent = stack.enter_context(engine)  # shut down on leaving
        else:
            assert model is not None  # checked above; narrows the type
            agent = OpenAIPolicy(
                base_url, model, api_key=api_key, sampling={"temperature": temperature}
            )
        plan = {
            "num_tasks": num_tasks, "group_size": group_size, "max_concurrency": concurrency,
            "seed": seed, "max_tokens_per_turn": max_tokens, "env_kwargs": env_kwargs_built,
        }  # fmt: skip
        summary, played = _run_eval(
            out, env_id, agent, run_config, done, total * group_size, plan, lock
        )
        _refuse_failed_episodes(played, out)
        # inside the tracked block: a follower of the run's log stops once it is finished
        _print_summary(summary, out)


def _with_model(
    model_path: Path | None, env_kwargs: dict[str, Any], policy: PolicyKind
) -> dict[str, Any]:
    """Env options for a local model: a model folder, and vllm: parsers get its tokenizer."""
    if model_path is None:
        raise ConfigError(f"--policy {policy.value} needs --model-path DIR (a local model folder)")
    from .engine._model_dir import require_model_folder

    return with_model_tokenizer(env_kwargs, str(require_model_folder(model_path)))


def _trained_adapter(
    path: Path, model_path: Path | None, policy: PolicyKind, servers: _Servers
) -> tuple[Path, Path]:
    """``--adapter``'s folder, and the model it samples on: ``--model-path``, else its base."""
    if not policy.local or servers.urls:
        raise ConfigError(
            "--adapter applies to --policy vllm or hf on the in-process engine; give a "
            "server its adapter with vllm serve --lora-modules"
        )
    with needs_extra("agentgym eval --adapter", "train"):
        from agentgym.trainers._export import trained_adapter

    adapter, base = trained_adapter(path, model_path, base_option="--model-path")
    return adapter.resolve(), base


@dataclass(frozen=True)
class _Servers:
    """``--server`` URLs (empty: the in-process engine), ``--router-url``, the served name."""

    urls: list[str]
    router_url: str | None
    served_name: str | None


_LOCAL = (PolicyKind.vllm, PolicyKind.hf)
_SAMPLED = (PolicyKind.openai, *_LOCAL)
#: `eval` options only some policies read -> those policies; the rest apply to every one.
#: (``--adapter`` is `_trained_adapter`'s: it is refused on servers too.)
_POLICY_OPTIONS: dict[str, tuple[PolicyKind, ...]] = {
    "model_path": _LOCAL, "chat_template_kwargs": _LOCAL, "rollout_mode": _LOCAL,
    "max_model_len": _LOCAL, "server": (PolicyKind.vllm,), "router_url": (PolicyKind.vllm,),
    "base_url": (PolicyKind.openai,), "api_key": (PolicyKind.openai,),
    "model": (PolicyKind.openai, PolicyKind.vllm),  # vllm: the name served by --server
    "temperature": _SAMPLED, "max_tokens": _SAMPLED,
}  # fmt: skip


def _typed_options(ctx: Any) -> dict[str, str]:
    """The options typed on the command line, name -> flag.

    Not those left at their default (``--temperature`` 1.0) nor read from the environment
    (``OPENAI_API_KEY`` set for other tools): only a typed option asks for something.
    """
    return {
        param.name: param.opts[0]
        for param in ctx.command.params
        if param.name
        and getattr(ctx.get_parameter_source(param.name), "name", None) == "COMMANDLINE"
    }


def check_policy_options(ctx: Any) -> None:
    """`_refuse_option_mix` for a parsed ``eval`` command line (a queued job's, too).

    ``ctx``: the command's click context (typer's, or one `make_context` built).
    """
    p = ctx.params
    servers = _Servers(p["server"], p["router_url"], p["model"])
    _refuse_option_mix(PolicyKind(p["policy"]), _typed_options(ctx), servers)


def _refuse_option_mix(policy: PolicyKind, typed: dict[str, str], servers: _Servers) -> None:
    """Options that belong to another ``--policy``, refused before anything loads.

    Ignored, they would read as applied: ``--model-path DIR`` without ``--policy`` evaluated
    the env's reference answers and filed them as the model's.
    """
    for name, flag in typed.items():
        owners = [p.value for p in _POLICY_OPTIONS.get(name, tuple(PolicyKind))]
        if policy.value not in owners:
            others = f" (or {', '.join(owners[1:])})" if owners[1:] else ""
            raise ConfigError(
                f"{flag} applies to --policy {_either(owners)}, not {policy.value}; "
                f"pass --policy {owners[0]}{others}, or drop {flag}"
            )
    if policy is PolicyKind.openai and not servers.served_name:
        raise ConfigError("--policy openai needs --model NAME (the served model name)")
    if servers.router_url and not servers.urls:
        raise ConfigError("--router-url needs the --server URLs too (adapters and checks)")


def _either(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``: the choices a message offers."""
    return " or ".join(filter(None, (", ".join(names[:-1]), names[-1])))


def _reference_turns(probe: Any, tasks: Sequence[Any]) -> Callable[[Any], Sequence[str]]:
    """The env's reference turns, refused before any work when it has none.

    `ToolEnv`'s default ``reference_turns`` returns None: played, every episode ended in
    'error' (a TypeError deep in `ScriptedPolicy`) and the run exited 0. Task 0 stands for
    all, as in `agentgym check`.
    """
    reference = getattr(probe, "reference_turns", None)
    if reference is None or (len(tasks) and reference(tasks[0]) is None):
        why = "its reference_turns returns None" if reference else "no reference_turns method"
        raise ConfigError(
            f"this env has no reference solution ({why}); use --policy openai, vllm or hf"
        )
    return reference


def _prepare_engine(
    model_path: Path,
    env_id: str,
    env_kwargs: dict[str, Any],
    sampling: dict[str, Any],
    template_kwargs: dict[str, Any],
    rollout_mode: RolloutModeChoice,
    max_model_len: int | None,
    servers: _Servers,
    *,
    transformers: bool = False,
    adapter: Path | None = None,
) -> Any:
    """A started engine, its rollout mode decided, sampling with ``adapter`` if given.

    `VLLMPolicy`; `RemoteVLLMPolicy` on ``servers``; `HFPolicy` with ``transformers``.
    """
    from .engine import HFPolicy, RemoteVLLMPolicy, SamplingConfig, VLLMFleet, VLLMPolicy

    tools, example = _checked_template(
        model_path, env_id, env_kwargs, template_kwargs, rollout_mode
    )
    options: dict[str, Any] = {
        "sampling": SamplingConfig.from_dict({k: v for k, v in sampling.items() if v is not None}),
        "chat_template_kwargs": template_kwargs,
        "rollout_mode": rollout_mode.value,
        "max_model_len": max_model_len,
    }
    policy: VLLMPolicy | RemoteVLLMPolicy | HFPolicy
    if servers.urls:
        fleet = VLLMFleet(servers.urls, servers.served_name or model_path.name)
        policy = RemoteVLLMPolicy(model_path, fleet, router_url=servers.router_url, **options)
    elif transformers:
        import torch

        cuda = torch.cuda.is_available()
        policy = HFPolicy(
            model_path, device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32",
            **options,
        )  # fmt: skip
    else:
        policy = VLLMPolicy(model_path, **options, **_lora_options(adapter))
    where = ", ".join(servers.urls) or model_path
    with console.status(f"starting {'transformers' if transformers else 'vLLM'} on {where}"):
        policy.start()
    try:
        if adapter is not None:
            version = policy.load_adapter(adapter)
            console.print(f"adapter {adapter} loaded as version {version}", soft_wrap=True)
        decision = policy.mode_for(tools, example)
    except BaseException:
        policy.close()
        raise
    console.print(f"rollout mode {decision.mode}: {decision.reason}", highlight=False)
    return policy


def _lora_options(adapter: Path | None) -> dict[str, Any]:
    """`VLLMPolicy` options that serve ``adapter``: LoRA on, the smallest servable rank."""
    if adapter is None:
        return {}
    from .engine._vllm import LORA_RANKS

    peft_config = json.loads((adapter / "adapter_config.json").read_text())
    rank = max([int(peft_config["r"]), *map(int, (peft_config.get("rank_pattern") or {}).values())])
    fits = [r for r in LORA_RANKS if r >= rank]
    if not fits:
        raise ConfigError(f"{adapter} has LoRA rank {rank}; vLLM serves at most {LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1}


def _checked_template(
    model_path: Path,
    env_id: str,
    env_kwargs: dict[str, Any],
    template_kwargs: dict[str, Any],
    rollout_mode: RolloutModeChoice,
) -> tuple[list[dict[str, Any]], list[Message]]:
    """The env's tool schemas and the conversation the rollout mode is decided on.

    That conversation is the one `agentgym check --model` reports on (the env's reference
    episode, or a probe with a second call after text). Chat-template kwargs the template
    never reads, and ``--rollout-mode concat`` with a template that cannot, are refused here,
    on the tokenizer alone, before the slow engine start.
    """
    from .engine import ChatRenderer
    from .engine._episode import probe_conversation

    probe = make(env_id, **env_kwargs)
    tools = getattr(probe, "tool_schemas", [])
    probe.close()
    tokenizer = load_tokenizer(str(model_path))
    problem = unread_template_kwargs(tokenizer, template_kwargs)
    if problem:
        raise ConfigError(f"--chat-template-kwargs: {problem}")
    example = reference_conversation(env_id, env_kwargs, tokenizer, template_kwargs)
    example = example or probe_conversation(tools)
    if rollout_mode is RolloutModeChoice.concat:
        decision = ChatRenderer(tokenizer, template_kwargs).decide_mode(example, tools)
        if decision.mode != "concat":
            raise ConfigError(
                f"--rollout-mode concat, but the chat template cannot: {decision.reason}; "
                "use --rollout-mode auto (or per_turn)"
            )
    return tools, example


def _run_eval(
    out: Path,
    env_id: str,
    agent: Policy,
    run_config: dict[str, Any],
    done: list[Trajectory],
    total: int,
    plan: dict[str, Any],
    lock: FolderLock,
) -> tuple[dict[str, Any], list[Trajectory]]:
    """Play the missing episodes, streaming each to ``out``: (the summary written, them)."""
    out.mkdir(parents=True, exist_ok=True)
    if lock.acquire() and (out / "trajectories.jsonl").exists():
        raise ConfigError(  # a fresh run raced another into the same new folder
            f"another agentgym eval started writing {out} meanwhile; rerun with --resume "
            "once it ended, or choose another --out"
        )
    remove_stale_writes(out)
    write_json(out / "run.json", run_config)
    started = time.perf_counter()
    results = out / "trajectories.jsonl"
    written = len(done)  # episodes in `results`, for the line a Ctrl-C prints
    try:
        with _progress() as progress, results.open("a") as sink:
            bar = progress.add_task(f"eval {env_id}", total=total, completed=len(done))

            def record(trajectory: Trajectory) -> None:
                nonlocal written
                sink.write(to_json_line(trajectory))
                sink.flush()  # a killed run keeps every finished episode
                written += 1
                progress.advance(bar)

            skip = {(t.task_index, t.group_index) for t in done}
            played = rollout(env_id, agent, on_episode=record, skip=skip, **plan)
    except KeyboardInterrupt:  # still exits 130 (typer), and the run store files it interrupted
        console.print(
            f"interrupted: {written} of {total} episodes are in {results}; run the same "
            "command with --resume to play the rest",
            soft_wrap=True,
        )
        raise
    wall = time.perf_counter() - started
    summary = summarize(done + played, wall_seconds=wall, played=len(played))
    summary |= {k: run_config[k] for k in ("env", "policy", "model", "group_size")}
    write_json(out / "summary.json", summary)
    return summary, played


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}", style="bold", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def _refuse_failed_episodes(played: list[Trajectory], out: Path) -> None:
    """A run whose every played episode failed evaluated nothing: refuse it, not exit 0.

    All infra_error (the model server or sandbox failed) exits 75, which queues retry, and
    --resume plays them again; all error (an exception in the env or the policy) exits 1
    naming the first one's exception. Some errors among scored episodes:
    a warning, since the scores stand.
    """
    results = out / "trajectories.jsonl"
    statuses = Counter(t.status for t in played)
    if played and statuses["infra_error"] == len(played):
        raise InfraError(
            _all_failed(played, "infra_error", "the model server or sandbox failed", results)
            + "; fix it, then rerun with --resume to play them again"
        )
    if played and statuses["error"] == len(played):
        first = _last_line(played[0].error)
        raise Error(
            _all_failed(played, "error", f"the first: {first}", results)
            + "; fix it, then rerun with another --out"  # --resume keeps episodes that errored
        )
    if statuses["error"]:
        console.print(
            f"warning: {statuses['error']} of {len(played)} episodes played ended in error; "
            f"their tracebacks are in {results}",
            soft_wrap=True,
        )


def _all_failed(played: list[Trajectory], status: str, cause: str, results: Path) -> str:
    """The start of the line refusing a run whose every played episode ended in ``status``."""
    return f"all {len(played)} episodes played ended in {status} ({cause}; see {results})"


def _last_line(text: str | None) -> str:
    """A traceback's last line: the exception and its message."""
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else "no error recorded"


def _print_summary(summary: dict[str, Any], out: Path) -> None:
    table = Table("metric", "value", title=f"{summary['env']} ({summary['policy']})")
    for key, value in summary.items():
        if key in ("env", "policy", "model"):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        table.add_row(key, shown)
    stdout.print(table)
    console.print(f"wrote {out / 'trajectories.jsonl'} and {out / 'summary.json'}", soft_wrap=True)


def _mount_commands() -> None:
    """The commands of the other packages; their modules import nothing optional at the top.

    So every command is listed on a base install, and one whose extra is missing says which
    extra to install when it runs (tests/test_base_install.py).
    """
    from .runs._cli import app as runs_app
    from .runs._cli import sweep
    from .sandboxes._cli import app as sandbox_app
    from .serve._cli import serve
    from .trainers._cli import export, train

    app.command("train")(train)
    app.command("export")(export)
    app.command("sweep")(sweep)
    app.command("serve")(serve)
    app.add_typer(sandbox_app, name="sandbox", help="Build, list, prune and benchmark sandboxes.")
    app.add_typer(runs_app, name="runs", help="List, show and compare indexed runs.")


_mount_commands()


def _print_error(message: str) -> None:
    console.print(Text.assemble(("error:", "red"), " ", message), highlight=False, soft_wrap=True)


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2.

    Without standalone mode the app returns a command's ``typer.Exit`` code instead of
    exiting (a failed ``check`` is 1); it must reach `sys.exit`, or every run exits 0.
    """
    skip_final_collection()
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except (ConfigError, typer.TyperException) as exc:  # typer's usage errors derive from it
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if message:  # empty when typer already printed the help (no arguments given)
            _print_error(message)
        sys.exit(2)
    except Error as exc:  # infrastructure (a server that would not start ...): not the user's
        _print_error(str(exc))
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)  # a command's return value is no code
