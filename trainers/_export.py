"""`export_run`: a run's trained adapter as a folder to serve or share, alone or merged.

Why: a checkpoint is for resuming (optimizer and RNG states beside the adapter) and lives in a
run folder that a resume rewrites. What a user deploys is either the adapter on its base
(``vllm serve BASE --enable-lora --lora-modules NAME=OUT``: megabytes, the base shared with
other adapters) or, for servers and tools without LoRA, the base with the adapter merged in
(``vllm serve OUT``). The base is the model the adapter was trained on, as the adapter's own
``base_model_name_or_path`` records it: the SFT warm start's folder when the run had one, not
the config's ``model``.

The export is written under a temporary name and renamed into place, so a folder named
``OUT`` is complete; ``OUT`` must not exist yet (an export never overwrites).

``best=True`` (``--best``) takes the kept checkpoint whose step's eval did best, for a run
whose reward peaked before its last step (keep every checkpoint with ``save_total_limit:
null``). It is chosen on the held-out tasks, so their figure for it is optimistic: tasks it
was not chosen on say how it does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from agentgym import Trajectory
from agentgym._check import load_tokenizer
from agentgym._durable import check_folder_can_be_made
from agentgym._errors import ConfigError
from agentgym.engine._model_dir import check_adapter_base, read_adapter_config
from agentgym.runs._folder import EXPORT_INFO

from ._metrics import is_multi_turn_success
from ._run_dir import WARM_START, atomic_dir, checkpoints_by_step, read_jsonl_records
from ._training_state import checkpoint_step


def export_run(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    step: int | None = None,
    best: bool = False,
    merge: bool = False,
    base_model: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the adapter of a run's checkpoint to ``out``; returns ``out``.

    Args:
        run_dir: the run's ``output_dir`` (finished, or still running: only read).
        out: a new folder.
        step: the checkpoint's step; None takes the newest.
        best: take the kept checkpoint whose step's eval did best instead (`best_checkpoint`);
            ``export.json`` records each kept step's score.
        merge: write the base model with the adapter merged into its weights (and the base's
            tokenizer and generation config) instead of the adapter alone.
        base_model: the base model folder, when the one the adapter records has moved.

    Raises:
        ConfigError: no such run or checkpoint (or, with ``best``, no kept one was evaluated),
            ``out`` exists, or the base is missing.
    """
    if best and step is not None:
        raise ConfigError(f"choose the checkpoint by step ({step}) or by its eval (best), not both")
    chosen_by: dict[str, Any] = {}
    if best:
        _, checkpoint, chosen_by = best_checkpoint(Path(run_dir))
    else:
        checkpoint = _checkpoint(Path(run_dir), step)
    adapter = checkpoint / "adapter"
    base = _base_model(adapter, base_model)
    out = Path(out).expanduser()
    if out.exists():
        raise ConfigError(f"{out} already exists; export into a new folder (or remove it first)")
    check_folder_can_be_made(out, "OUT")  # a file or a read-only folder above it: one line
    if merge:  # the merged folder gets the base's tokenizer: one without a vocabulary wrote
        load_tokenizer(base)  # a folder whose tokenizer turned every text into nothing
    info = {
        "run": str(Path(run_dir).resolve()),
        "step": checkpoint_step(checkpoint, "export another checkpoint (--step)"),
        "base_model": str(base),
        "merged": merge,
        **chosen_by,
    }
    with export_dir(out) as tmp:
        if merge:
            _write_merged(base, adapter, tmp)
        else:
            shutil.copytree(adapter, tmp, dirs_exist_ok=True)
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return out


def export_dir(out: Path) -> contextlib.AbstractContextManager[Path]:
    """The temporary folder an export is written in, renamed to ``out`` when complete.

    Never over an ``out`` made meanwhile (a second export to it); the temp folders of exports
    to ``out`` that were killed (a whole merged model each) are removed first, but not those
    of a live one (`atomic_dir`'s ``sweep``).
    """
    return atomic_dir(out, replace=False, sweep=True)


def _checkpoint(run_dir: Path, step: int | None) -> Path:
    """The checkpoint to export: step ``step``, or the newest."""
    found = _kept_checkpoints(run_dir)
    if step is None:
        return found[max(found)]
    if step not in found:
        kept = ", ".join(map(str, found))
        raise ConfigError(f"{run_dir} has no checkpoint of step {step}; it keeps steps {kept}")
    return found[step]


def best_checkpoint(run_dir: Path) -> tuple[int, Path, dict[str, Any]]:
    """The step and folder of the kept checkpoint whose eval succeeded most, and the scores.

    Each evaluated step is scored by multi-turn success (`is_multi_turn_success`, the run's
    headline figure) on the held-out tasks every evaluated step played (an ``infra_error``
    episode played nothing): periodic evals may play the first `eval_num_tasks`, the final eval
    plays all. Ties go to the later step.
    """
    kept = _kept_checkpoints(run_dir)
    successes: dict[int, dict[Any, bool]] = {}
    for record in read_jsonl_records(run_dir / "eval_trajectories.jsonl"):  # a live run's too
        step = record.get("info", {}).get("step")
        if step in kept and record.get("status") != "infra_error":  # not the model's doing
            episode = Trajectory.from_dict(record)
            task = episode.task_position if episode.task_index is None else episode.task_index
            successes.setdefault(step, {})[task] = is_multi_turn_success(episode)
    steps = ", ".join(map(str, sorted(successes) or kept))
    if not successes:
        raise ConfigError(
            f"{run_dir}: no kept checkpoint (steps {steps}) was evaluated; pass --step, or "
            "train with eval_steps dividing save_steps"
        )
    shared = set.intersection(*(set(tasks) for tasks in successes.values()))
    if not shared:
        raise ConfigError(
            f"{run_dir}: the evals of steps {steps} played no task in common, so they do not "
            "compare; pass --step"
        )
    scores = {
        step: sum(tasks[t] for t in shared) / len(shared)
        for step, tasks in sorted(successes.items())
    }
    best = max(scores, key=lambda step: (scores[step], step))
    return best, kept[best], {
        "chosen_by": "eval/success",
        "eval_tasks": len(shared),
        "eval_success": {str(step): score for step, score in scores.items()},
    }  # fmt: skip


def _kept_checkpoints(run_dir: Path) -> dict[int, Path]:
    """The run's complete checkpoints by step, oldest first; at least one."""
    if not (run_dir / "config.yaml").is_file() and (run_dir / "config.json").is_file():
        raise ConfigError(
            f"{run_dir} is already a plain model (a fine-tuned model folder, such as agentgym "
            f"sft writes), nothing to export; `agentgym eval ENV --policy vllm --model-path "
            f"{run_dir}` uses it directly"
        )
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(
            f"{run_dir} is not a run folder (no config.yaml); pass a run's output_dir"
        )
    found = checkpoints_by_step(run_dir)
    if not found:
        raise ConfigError(
            f"{run_dir} has no checkpoint yet; a run saves one every save_steps steps and at "
            "the end"
        )
    return found


def trained_adapter(
    path: str | os.PathLike[str],
    base_model: str | os.PathLike[str] | None = None,
    *,
    base_option: str = "--base-model",
) -> tuple[Path, Path]:
    """The adapter folder ``path`` names, and the base model folder it was trained on.

    ``path`` is a PEFT adapter folder (an export, a checkpoint's ``adapter/``), a checkpoint
    folder, or a run folder (its newest checkpoint), so a trained adapter is evaluated where
    it lies (``agentgym eval --adapter``), without an export or a merge. ``base_model``
    overrides the base the adapter records; ``base_option`` names it in the error.
    """
    path = Path(path)
    if (path / "adapter_config.json").is_file():
        adapter = path
    elif (path / "adapter" / "adapter_config.json").is_file():
        adapter = path / "adapter"
    elif (path / "config.yaml").is_file():
        adapter = _checkpoint(path, None) / "adapter"
    else:
        raise ConfigError(
            f"{path} is not a LoRA adapter (no adapter_config.json), a checkpoint or a run "
            "folder; pass one of those (agentgym export writes an adapter folder)"
        )
    return adapter, _base_model(adapter, base_model, base_option)


def _base_model(
    adapter: Path, given: str | os.PathLike[str] | None, option: str = "--base-model"
) -> Path:
    """The folder of the model the adapter was trained on (or ``given``), checked."""
    recorded = read_adapter_config(adapter).get("base_model_name_or_path")
    if given is None and not isinstance(recorded, str):
        raise ConfigError(
            f"the adapter at {adapter} does not say which model it was trained on "
            f"(no base_model_name_or_path); pass that model's folder with {option} DIR"
        )
    base = Path(given) if given is not None else _recorded_base(adapter, Path(str(recorded)))
    if not (base / "config.json").is_file():
        raise ConfigError(
            f"the base model {base} is gone (no config.json; the adapter was trained on "
            f"{recorded}); pass the folder it is in now with {option} DIR"
        )
    check_adapter_base(adapter, base)  # a wrong --base-model exported, or failed to merge
    return base.resolve()


def _recorded_base(adapter: Path, recorded: Path) -> Path:
    """The base an adapter records, found from any working folder.

    A checkpoint's adapter in a run that warm-started takes the run folder's own ``sft/``
    (`_run_warm_start`), and an export the base it was exported on (`EXPORT_INFO`), before
    the path the adapter records: a warm start is recorded by its absolute path, which a run
    folder copied or moved leaves behind, and which a new run in the old folder fills with
    its own warm start (the probe's export merged into that one: 1.28 nats/token off).
    A run given a relative ``output_dir`` records its SFT base relative to the folder it was
    started in (``runs/quickstart/sft``); read from elsewhere, that path names nothing, so it
    is also tried against the adapter's own folders, nearest first.
    """
    own = _own_base(adapter)
    if own is not None:
        return own
    if (recorded / "config.json").is_file() or recorded.is_absolute():
        return recorded
    candidates = [p / recorded for p in adapter.resolve().parents]
    return next((p for p in candidates if (p / "config.json").is_file()), recorded)


def _own_base(adapter: Path) -> Path | None:
    """The base that travels with the adapter, if there is one: its run's or its export's.

    Why it beats the recorded path: the checkpoint and ``sft/`` were written by the same run,
    so where both are there is no doubt which base the adapter trained on; the recorded path
    only said where that ``sft/`` was then (when the run did not move: the same folder). No
    content is compared: ``sft.json`` records no digest of the weights, and a folder at the
    recorded path that differs from the run's own is another run's, never this one's.
    """
    own = _run_warm_start(adapter)
    if own is not None or not (adapter / EXPORT_INFO).is_file():
        return own
    try:
        info = json.loads((adapter / EXPORT_INFO).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):  # damaged: the recorded path decides
        return None
    exported = info.get("base_model") if isinstance(info, dict) else None
    if not isinstance(exported, str) or not (Path(exported) / "config.json").is_file():
        return None
    return Path(exported)


def _run_warm_start(adapter: Path) -> Path | None:
    """The warm start in the run folder of a checkpoint's adapter, if that folder has one.

    A checkpoint's adapter lies in ``RUN/checkpoints/step-N/adapter``; its base, when the run
    warm-started, is ``RUN/sft``, recorded by its absolute path: a run folder moved or copied
    elsewhere still holds it.
    """
    checkpoints = adapter.resolve().parent.parent
    if checkpoints.name != "checkpoints":
        return None
    own = checkpoints.parent / WARM_START
    return own if (own / "config.json").is_file() else None


def _write_merged(base: Path, adapter: Path, out: Path) -> None:
    """Save ``base`` with ``adapter`` merged in, and the base's tokenizer, into ``out``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
