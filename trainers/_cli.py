"""`agentgym train CONFIG.yaml`: the trainer's command, mounted by `agentgym.cli`.

Config problems (unknown keys, bad values, an env that does not exist, a model without a
chat template) are `ConfigError`s raised before any model loads; the CLI prints them as one
line and exits 2.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.logging import RichHandler

from agentgym._cli_common import PipedConsole, key_value, print_warning
from agentgym._errors import ConfigError
from agentgym._extras import needs_extra
from agentgym._yaml import load_cli_value

console = PipedConsole(markup=False)  # figures and paths, never markup


def _overrides(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs, values parsed as YAML (``max_steps=5``, ``report_to=[none]``)."""
    split = [(pair, *key_value(pair, "--set")) for pair in pairs]
    return {key: load_cli_value(value, f"--set {pair!r}") for pair, key, value in split}


def _quiet_backends() -> None:
    """Our progress on the console at INFO; vLLM and transformers only when they warn."""
    from agentgym.engine._quiet import quiet_backends

    quiet_backends()
    logger = logging.getLogger("agentgym")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        logger.addHandler(RichHandler(console=console, show_path=False))
        logger.setLevel(logging.INFO)


def train(
    config: Annotated[Path, typer.Argument(help="A GRPOConfig YAML file.")],
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in output_dir from its checkpoint.")
    ] = False,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a config key: --set max_steps=5, or one entry of a mapping: "
            "--set env_kwargs.parser=mistral (repeatable).",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Make the checks a run makes before its model loads, print the run's plan "
            "and stop: no engine, no weights, nothing written to the run folder.",
        ),
    ] = False,
) -> None:
    """Train a LoRA adapter with GRPO on vLLM rollouts (SFT warm start first if configured).

    Several processes: `torchrun --standalone --nproc_per_node N --no-python agentgym train CONFIG`
    (docs/trainer.md); rank 0 alone indexes the run and prints its figures.
    """
    _quiet_backends()
    from ._config import GRPOConfig
    from ._distributed import World

    with needs_extra("agentgym train", "train"):
        from ._grpo import GRPOTrainer

    if not config.is_file():
        what = "is a folder, not a YAML file" if config.is_dir() else "does not exist"
        raise ConfigError(f"config file {config} {what}")
    with warnings.catch_warnings(record=True) as said:  # the config's cautions (its rules, a
        try:  # renamed key): one line each, of the user's config, not our source line
            cfg = GRPOConfig.from_yaml(config, overrides=_overrides(set_ or []))
        finally:  # a refused config's earlier cautions too
            for warning in said:
                print_warning(str(warning.message))
    if dry_run:
        _print_plan(cfg, resume)
        return
    from agentgym.runs import track_run

    main = World.from_env().is_main
    run_name = Path(cfg.output_dir).name
    tracking = track_run("train", run_name, cfg.to_dict(), cfg.output_dir) if main else None
    with tracking or contextlib.nullcontext():
        figures = GRPOTrainer(cfg, resume=resume).train()
    if not main:
        return
    for name, value in figures.items():
        console.print(f"{name}: {value:.3f}")
    console.print(f"run folder: {cfg.output_dir}", soft_wrap=True)


def _print_plan(cfg: Any, resume: bool) -> None:
    """The dry run's plan, one aspect a line (`trainers._plan`)."""
    from ._distributed import World
    from ._plan import dry_run

    rows = dry_run(cfg, resume=resume)
    if not World.from_env().is_main:  # every rank checks; one prints
        return
    width = max(len(what) for what, _ in rows)
    for what, how in rows:
        console.print(f"{what:<{width}}  {how}", soft_wrap=True)
    console.print("dry run: every check passed; nothing was trained and no run folder written")


def export(
    run: Annotated[Path, typer.Argument(help="The run folder (its output_dir).")],
    out: Annotated[Path, typer.Argument(help="A new folder to write.")],
    step: Annotated[
        int | None, typer.Option("--step", help="The checkpoint's step (default: the newest).")
    ] = None,
    best: Annotated[
        bool,
        typer.Option(
            "--best",
            help="The kept checkpoint whose eval succeeded most (chosen on the held-out tasks, "
            "so their figure for it is optimistic).",
        ),
    ] = False,
    merge: Annotated[
        bool,
        typer.Option("--merge", help="Write the base model with the adapter merged in."),
    ] = False,
    base_model: Annotated[
        Path | None,
        typer.Option("--base-model", help="The base model's folder, if it moved since training."),
    ] = None,
) -> None:
    """Export a run's trained adapter, alone or merged into its base, ready for vllm serve."""
    from agentgym.runs._folder import EXPORT_INFO

    from ._export import export_run

    with needs_extra("agentgym export --merge", "train") if merge else contextlib.nullcontext():
        folder = export_run(run, out, step=step, best=best, merge=merge, base_model=base_model)
    info = json.loads((folder / EXPORT_INFO).read_text())
    what = "merged model" if merge else "adapter"
    if best:
        scores = ", ".join(f"{s}: {v:.1%}" for s, v in info["eval_success"].items())
        console.print(f"eval success by step on {info['eval_tasks']} held-out tasks: {scores}")
    # soft_wrap: a path or command is printed whole, never broken where it cannot be pasted
    console.print(f"{what} of {run} at step {info['step']} written to {folder}", soft_wrap=True)
    if merge:
        console.print(f"serve it: vllm serve {folder}", soft_wrap=True)
    else:
        console.print(
            f"serve it: vllm serve {info['base_model']} --enable-lora "
            f"--lora-modules {folder.name}={folder}",
            soft_wrap=True,
        )
