"""What the index copies out of a run folder: headline figures, last step, the log's last lines.

The folder is the source of truth (``summary.json``, ``status.json``, ``metrics.jsonl``,
``trajectories.jsonl``, an ``agentgym sft`` model folder's ``sft.json``, logs); these readers
never fail on a missing or half-written file, they return what they can, because they run while
a run may be dying.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentgym._errors import ConfigError

#: The combined stdout/stderr of a job started by a queue.
OUTPUT_LOG = "output.log"
#: What ``agentgym sft`` writes last in its OUT folder: knobs, source, per-step history.
SFT_SUMMARY = "sft.json"
#: What `agentgym export` writes beside an adapter or merged model: the run it came from.
EXPORT_INFO = "export.json"
#: The files that mark a folder as each kind of run's (a train run's ``output_dir``, an eval's
#: ``--out``, an ``agentgym sft`` OUT), by kind.
RUN_FILES: dict[str, tuple[str, ...]] = {
    "train": ("config.yaml", "status.json", "metrics.jsonl", "checkpoints"),
    "eval": ("run.json", "trajectories.jsonl"),
    "sft": (SFT_SUMMARY,),
}
#: Logs looked at for a failed run's last lines, most specific first.
_LOGS = (OUTPUT_LOG, "train.log")
TAIL_LINES = 20


def refuse_another_kind_of_run(path: Path, kind: str, option: str) -> None:
    """Refuse ``path`` for a run of ``kind`` when it holds another kind of run.

    Why: train and eval runs both write ``summary.json`` (and both are indexed by folder), so
    an eval pointed at a train run's folder replaced the run's figures, findings and eval
    history with its own, and a train run into an eval's folder did the same the other way.
    """
    for other, files in RUN_FILES.items():
        found = [name for name in files if (path / name).exists()]
        if other != kind and found:
            raise ConfigError(
                f"{option} {path} holds an agentgym {other} run ({', '.join(found)}), whose "
                f"files this {kind} run would overwrite; choose a folder of its own, such as "
                f"{path / kind}"
            )


def read_figures(run_dir: Path) -> dict[str, float]:
    """Numbers of ``summary.json``, nested ones as ``a/b``, else an sft run's; {} before either.

    A train run's headline ``figures`` mapping (``grpo/success`` ...) keeps its own names.
    """
    data = read_json(run_dir / "summary.json")
    if not isinstance(data, Mapping):
        return _sft_figures(run_dir)
    headline = data.get("figures")
    rest = {k: v for k, v in data.items() if k != "figures"}
    return _flatten_numbers(rest) | (
        _flatten_numbers(headline) if isinstance(headline, Mapping) else {}
    )


def _sft_figures(run_dir: Path) -> dict[str, float]:
    """An sft run's headline numbers (`sft_figures`), as ``sft/...``."""
    data = read_json(run_dir / SFT_SUMMARY)
    return _flatten_numbers(sft_figures(data), "sft/") if isinstance(data, Mapping) else {}


def sft_figures(record: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers that compare SFT runs, from an ``sft.json`` record.

    The loss it ended at, the share of validation traces it carried out, how many traces and
    episodes it trained on. Why: ``sft.json`` holds one record per step; the index (and a train
    run's summary, for its warm start) keeps these, not the whole history.
    """
    history = _sft_history(record)
    source = record.get("source")
    source = source if isinstance(source, Mapping) else {}
    accuracies = [r["reference_accuracy"] for r in history if "reference_accuracy" in r]
    return {
        "first_loss": history[0].get("loss") if history else None,
        "loss": history[-1].get("loss") if history else None,
        "reference_accuracy": accuracies[-1] if accuracies else None,
        "traces": record.get("num_examples"), "seconds": record.get("seconds"),
        "episodes_read": source.get("read"), "episodes_kept": source.get("kept"),
    }  # fmt: skip


def read_step(run_dir: Path) -> int | None:
    """The last step a train or sft run reported, or an eval run's episodes."""
    status = read_json(run_dir / "status.json")
    if isinstance(status, Mapping) and isinstance(status.get("step"), int):
        return int(status["step"])
    summary = read_json(run_dir / "summary.json")
    if isinstance(summary, Mapping) and isinstance(summary.get("episodes"), int):
        return int(summary["episodes"])
    sft = read_json(run_dir / SFT_SUMMARY)
    history = _sft_history(sft) if isinstance(sft, Mapping) else []
    last = history[-1].get("step") if history else None
    return last if isinstance(last, int) else None


def _sft_history(summary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``sft.json``'s per-step records, anything else in its ``history`` left out."""
    history = summary.get("history")
    return [r for r in history if isinstance(r, Mapping)] if isinstance(history, list) else []


def live_step(run: Mapping[str, Any]) -> int | None:
    """The step a run has reached: the index's, or a running run's own (``status.json``).

    Why: the index records a run's step when its process ends, so while a run trains, the
    step column of `agentgym runs ls` and of the dashboard's runs table stayed empty.
    """
    if run.get("step") is not None or run.get("status") != "running" or not run.get("run_dir"):
        return run.get("step")
    return read_step(Path(run["run_dir"]))


def run_file(run_dir: str | Path, name: str) -> Path | None:
    """``run_dir/name`` when it is a regular file inside the run folder, else None.

    Why: what the API and the dashboard serve from a run folder must stay in it; a symlink that
    leads out of it (``output.log -> /etc/passwd``) or a FIFO (a read would block) is not served.
    """
    path = Path(run_dir) / name
    try:
        real, root = path.resolve(strict=True), Path(run_dir).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, a symlink loop, an unreadable folder
        return None
    # the resolved path: a symlink swapped after this check cannot point the open elsewhere
    return real if real.is_relative_to(root) and real.is_file() else None


def log_path(run_dir: str | Path) -> Path | None:
    """A job's ``output.log``, else a train run's ``train.log``; None before either exists."""
    for name in _LOGS:
        path = run_file(run_dir, name)
        if path is not None:
            return path
    return None


def log_tail(run_dir: Path, lines: int = TAIL_LINES) -> str | None:
    """The last ``lines`` lines of the run's log, or None when it wrote none."""
    path = log_path(run_dir)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    return "\n".join(text.rstrip().splitlines()[-lines:]) if text.strip() else None


def has_checkpoint(kind: str, run_dir: Path) -> bool:
    """Whether a ``--resume`` of this run would continue rather than start over.

    A train run needs a complete checkpoint (``checkpoints/step-*/trainer_state.json``); an
    sft run, its `sft_checkpoint`; an eval run, one finished episode in ``trajectories.jsonl``.
    """
    if kind == "train":
        return any(run_dir.glob("checkpoints/step-*/trainer_state.json"))
    if kind == "sft":
        return sft_checkpoint(run_dir).is_file()
    try:
        return b"\n" in (run_dir / "trajectories.jsonl").read_bytes()
    except OSError:
        return False


def sft_checkpoint(run_dir: Path) -> Path:
    """Where ``agentgym sft`` with OUT ``run_dir`` keeps its checkpoint.

    The one rule: the SFT loop saves there, and the queue resumes a job that has one. Beside
    the folder, not in it (``<run_dir>.partial/state.pt``): it is the training's state,
    removed once the model is saved, and OUT is a plain model folder.
    """
    return run_dir.with_name(run_dir.name + ".partial") / "state.pt"


def remove_spent_sft_checkpoint(run_dir: Path) -> Path | None:
    """Remove the checkpoint of a finished SFT model (`sft_checkpoint`); the folder removed.

    Why: a kill between the model's save and the checkpoint's removal leaves it beside the
    model for good, as large as the model with its optimiser state, and nothing resumes it.
    """
    spent = sft_checkpoint(run_dir).parent
    if not (run_dir / SFT_SUMMARY).is_file() or not spent.is_dir():
        return None
    shutil.rmtree(spent, ignore_errors=True)
    return spent


def read_json(path: Path) -> Any:
    """A JSON file's value; None when it is missing or unreadable (a run may be mid-write).

    Only a regular file is read: a FIFO named ``status.json`` in a run folder hung ``runs
    ls`` and the dashboard's list, a read that waits for a writer forever. The open does not
    wait (``O_NONBLOCK``), and what it opened is checked, so nothing swapped in between counts.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        try:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return None
            return json.loads(file.read().decode("utf-8"))
        except (OSError, ValueError):
            return None


def _flatten_numbers(data: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out[name] = value
        elif isinstance(value, Mapping):
            out |= _flatten_numbers(value, f"{name}/")
    return out
