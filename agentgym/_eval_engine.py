"""The model that plays ``agentgym eval --policy vllm | hf``: checked, then started.

The chat template is checked on the tokenizer alone (kwargs it never reads, ``--rollout-mode
concat`` it cannot do) before the slow engine start; the rollout mode is then decided on the
conversation `agentgym check --model` reports on, so the two agree.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from ._check import lists_tools, load_tokenizer, reference_conversation, with_model_tokenizer
from ._check_template import (
    call_format_problem,
    unread_template_kwargs,
    unshown_tools_problem,
)
from ._cli_common import console
from ._errors import ConfigError
from ._eval_options import PolicyKind, RolloutModeChoice, Servers
from ._extras import needs_extra
from ._registry import make, resolve_id
from ._types import Message
from .parsers import ToolCallParser
from .runs._folder import EXPORT_INFO


def local_model(model_path: Path | None, seed: int) -> Path | None:
    """``--model-path`` as a folder: ``tiny`` / ``tiny:PRESET`` are built here, with ``seed``.

    So the model a run trained from (``model: tiny:quickstart``) is named the same way here.
    """
    if model_path is None:
        return None
    from .engine.tiny import tiny_model_folder

    return tiny_model_folder(str(model_path), seed=seed) or model_path


def local_env_kwargs(
    model_path: Path | None, env_kwargs: dict[str, Any], policy: PolicyKind
) -> dict[str, Any]:
    """Env options for a local model: a model folder, and vllm: parsers get its tokenizer."""
    if model_path is None:
        raise ConfigError(f"--policy {policy.value} needs --model-path DIR (a local model folder)")
    from .engine._model_dir import require_model_folder

    return with_model_tokenizer(env_kwargs, str(require_model_folder(model_path)))


def trained_adapter_and_base(
    path: Path, model_path: Path | None, policy: PolicyKind, servers: Servers
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


@dataclasses.dataclass(frozen=True)
class PlaySettings:
    """The eval options that decide what an episode asks of the model (besides the model)."""

    env_kwargs: dict[str, Any]
    max_tokens: int | None
    max_model_len: int | None
    chat_template_kwargs: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """The run folder an adapter was trained in, and how that run played its episodes."""

    folder: Path
    env: str
    settings: PlaySettings
    #: The run's held-out task indices, given its env's task count (`GRPOConfig.task_split`).
    held_out: Callable[[int], list[int]]


def trained_run(trained: Path, *, exported_only: bool = False) -> TrainedRun | None:
    """The run ``trained`` came from: the run folder holding it, or the run an export names.

    ``trained``: an adapter (a checkpoint's, a served one, an export's), or a model folder
    `agentgym export --merge` wrote. Why: the run played its episodes with its own env
    options (a system prompt, a turn limit, a task count), tokens per turn and context; an
    eval of its adapter that plays them otherwise measures another task (the quickstart's
    adapter scored 0% under the env's default system prompt, 92% under its own; an exported
    one did, silently, as its export.json was not read). ``exported_only``: only the run an
    export names (a model folder's parents are no run of its).
    """
    folder = _exported_from(trained)
    if folder is None and not exported_only:
        folder = next((p for p in trained.parents if (p / "config.yaml").is_file()), None)
    if folder is None or not (folder / "checkpoints").is_dir():
        return None
    from agentgym.trainers._config import GRPOConfig

    try:
        config = GRPOConfig.from_yaml(folder / "config.yaml")
    except ConfigError as exc:
        console.print(f"warning: not using the settings of run {folder}: {exc}", soft_wrap=True)
        return None
    settings = PlaySettings(
        config.run_env_kwargs,
        config.max_completion_length,
        config.max_model_len,
        config.chat_template_kwargs,
    )
    return TrainedRun(folder, config.env, settings, lambda count: config.task_split(count)[1])


def _exported_from(trained: Path) -> Path | None:
    """The run folder ``trained``'s export.json names (`agentgym export`), if it is still there.

    A run that is gone is said in a line: its settings cannot be used.
    """
    try:
        run = Path(json.loads((trained / EXPORT_INFO).read_text(encoding="utf-8"))["run"])
    except (OSError, ValueError, KeyError, TypeError):  # no export, or not one of ours
        return None
    if not (run / "config.yaml").is_file():
        console.print(
            f"warning: {trained} was exported from run {run}, which is gone: the settings it "
            "played with (env options, tokens per turn) are not used; give them here "
            "(--env-arg, --max-tokens)",
            soft_wrap=True,
        )
        return None
    return run


def with_run_settings(
    run: TrainedRun, env_id: str, typed: Collection[str], given: PlaySettings
) -> PlaySettings:
    """``given`` with the run's settings where the command line gave none, said in a line.

    Env options merge key by key (an ``--env-arg`` wins over the run's value of that key); on
    another env than the run's, nothing is taken.
    """
    if resolve_id(run.env) != env_id:
        console.print(
            f"warning: the adapter's run {run.folder} trained on {resolve_id(run.env)}; its "
            f"settings are not used on {env_id}",
            soft_wrap=True,
        )
        return given
    taken = {
        f.name: getattr(run.settings, f.name)
        for f in dataclasses.fields(PlaySettings)
        if f.name not in typed and f.name != "env_kwargs"
    }
    merged = dataclasses.replace(
        given, env_kwargs={**run.settings.env_kwargs, **given.env_kwargs}, **taken
    )
    shown = ", ".join(f"{k} {v!r}" for k, v in dataclasses.asdict(merged).items())
    console.print(
        f"playing as run {run.folder} did (an option given here wins): {shown}", soft_wrap=True
    )
    return merged


def prepare_engine(
    model_path: Path,
    env_id: str,
    env_kwargs: dict[str, Any],
    sampling: dict[str, Any],
    template_kwargs: dict[str, Any],
    rollout_mode: RolloutModeChoice,
    max_model_len: int | None,
    servers: Servers,
    *,
    transformers: bool = False,
    adapter: Path | None = None,
) -> Any:
    """A started engine, its rollout mode decided, sampling with ``adapter`` if given.

    `VLLMPolicy`; `RemoteVLLMPolicy` on ``servers``; `HFPolicy` with ``transformers``.
    """
    from .engine import HFPolicy, RemoteVLLMPolicy, SamplingConfig, VLLMFleet, VLLMPolicy

    tools, example = _checked_template(
        model_path, env_id, env_kwargs, template_kwargs, rollout_mode, max_model_len
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
    else:  # float32 on the CPU, as a run's rollouts: an eval measures what the run trained
        import torch

        cuda = torch.cuda.is_available()
        dtype = "bfloat16" if cuda else "float32"
        if transformers:
            policy = HFPolicy(model_path, device="cuda" if cuda else "cpu", dtype=dtype, **options)
        else:
            policy = VLLMPolicy(model_path, dtype=dtype, **options, **lora_options(adapter))
    where = ", ".join(servers.urls) or model_path
    try:
        with console.status(f"starting {'transformers' if transformers else 'vLLM'} on {where}"):
            # the adapter first: its folder is checked before the engine starts, not after
            version = policy.load_adapter(adapter) if adapter is not None else None
            policy.start()
        if version is not None:
            console.print(f"adapter {adapter} loaded as version {version}", soft_wrap=True)
        decision = policy.mode_for(tools, example)
    except BaseException:
        policy.close()
        raise
    console.print(f"rollout mode {decision.mode}: {decision.reason}", highlight=False)
    return policy


def lora_options(adapter: Path | None) -> dict[str, Any]:
    """`VLLMPolicy` options that serve ``adapter``: LoRA on, the smallest servable rank."""
    if adapter is None:
        return {}
    from .engine._model_dir import adapter_rank
    from .engine._vllm import LORA_RANKS

    rank = adapter_rank(adapter)
    if rank is None:
        raise ConfigError(
            f"{adapter}/adapter_config.json gives no LoRA rank (r); save the adapter again "
            "(PEFT's save_pretrained)"
        )
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
    max_model_len: int | None = None,
) -> tuple[list[dict[str, Any]], list[Message]]:
    """The env's tool schemas and the conversation the rollout mode is decided on.

    That conversation is the one `agentgym check --model` reports on (the env's reference
    episode, or a probe with a second call after text). Chat-template kwargs the template
    never reads, ``--rollout-mode concat`` with a template that cannot, a template that
    shows the tools and a call format the env's parser does not read (the model would call no
    tool: the eval would measure the parser, not the model), and an opening prompt that fills
    ``max_model_len`` are refused here, on the tokenizer alone, before the slow engine start.
    A template that never shows the tools (unless the env lists them) is only warned of: the
    trainer refuses it, but an eval of such a model as it is can be the question asked.
    """
    from .engine import ChatRenderer
    from .engine._episode import opening_prompt_problem, probe_conversation

    probe = make(env_id, **env_kwargs)
    tools, parser = getattr(probe, "tool_schemas", []), getattr(probe, "parser", None)
    env_lists = lists_tools(probe)
    probe.close()
    tokenizer = load_tokenizer(str(model_path))
    problem = unread_template_kwargs(tokenizer, template_kwargs)
    if problem:
        raise ConfigError(f"--chat-template-kwargs: {problem}")
    renderer = ChatRenderer(tokenizer, template_kwargs)
    unshown = unshown_tools_problem(renderer, tools) if not env_lists else ""
    if tools and not env_lists and not unshown and isinstance(parser, ToolCallParser):
        if problem := call_format_problem(renderer, tools, parser):  # as the trainer checks
            raise ConfigError(f"{model_path}: {problem}")
    example = reference_conversation(env_id, env_kwargs, tokenizer, template_kwargs)
    example = example or probe_conversation(tools)
    if max_model_len and (problem := opening_prompt_problem(renderer, example, tools,
                                                            max_model_len)):  # fmt: skip
        raise ConfigError(f"{problem}; raise --max-model-len to what the model allows")
    if rollout_mode is RolloutModeChoice.concat:
        decision = renderer.decide_mode(example, tools)
        if decision.mode != "concat":
            raise ConfigError(
                f"--rollout-mode concat, but the chat template cannot: {decision.reason}; "
                "use --rollout-mode auto (or per_turn)"
            )
    if unshown:  # played as asked (a baseline of such a model is a fair question), but said
        # once nothing refuses the run: at 0% the prompt, not the model, is what it measured
        console.print(f"warning: {model_path}: {unshown}", style="yellow", soft_wrap=True)
    return tools, example
