"""Where step metrics go besides ``metrics.jsonl``: trackers, and the console.

`Trackers` fans each step's scalars out to TensorBoard, trackio and/or Weights & Biases
(``report_to``), and the run's health findings where the backend shows text (`Trackers.note`).
Each backend is imported only when asked for; ``"auto"`` means each one that is installed.
W&B never prompts for a login: it runs offline unless ``WANDB_MODE`` or ``WANDB_API_KEY``
says otherwise (``wandb sync`` uploads an offline run later).

A tracker that fails while logging is switched off with one warning, not retried every step,
and never stops training: ``metrics.jsonl`` (`RunDir.write_metrics`) is the record that
counts. A tracker that cannot start raises `ConfigError` before training starts.

`TrainingConsole` is the progress display: one live bar with the headline numbers of the
last step, plus a persistent line every few steps (about 20 per run) and at each eval.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentgym._errors import ConfigError

from ._run_dir import rolled_back_path

log = logging.getLogger(__name__)

#: Tracker backends, in the order ``"auto"`` tries them; value: the pip package to install.
BACKENDS: dict[str, str] = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}


def resolve_report_to(report_to: str | Sequence[str]) -> list[str]:
    """The backends ``report_to`` asks for: ``"auto"`` = each installed, ``"none"`` = none.

    Raises:
        ConfigError: an unknown name, or a named backend that is not installed (the message
            names the pip install).
    """
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    unknown = [n for n in names if n not in (*BACKENDS, "auto", "none")]
    if unknown:
        raise ConfigError(
            f"report_to={names!r}: unknown tracker {unknown[0]!r}; use 'auto', 'none' or any of "
            f"{list(BACKENDS)}"
        )
    if "none" in names:
        return []
    if "auto" in names:
        return [b for b in BACKENDS if _installed(b)]
    missing = [b for b in names if not _installed(b)]
    if missing:
        raise ConfigError(
            f"report_to includes {missing[0]!r} but it is not installed; "
            f"pip install {BACKENDS[missing[0]]} (or drop it from report_to)"
        )
    return list(dict.fromkeys(names))


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of ``metrics`` as floats (tensors and numpy scalars included)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        if isinstance(value, (int, float)):  # bool is an int: logged as 0/1
            out[key] = float(value)
    return out


def trackio_run_name(run_dir: Path) -> str:
    """The trackio run of ``run_dir``: its folder name and the run's own id (``status.json``).

    Why: trackio continues any run of the same name in the project, so two runs whose folders
    share a name (``a/exp`` and ``b/exp``, or a folder deleted and trained again) would fold
    into one trackio run, their steps logged twice. The id survives ``--resume``, so a
    resumed run continues its own trackio run. A folder without an id keeps its bare name.
    """
    try:
        run_id = json.loads((run_dir / "status.json").read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        run_id = None
    return f"{run_dir.name}-{run_id}" if isinstance(run_id, str) and run_id else run_dir.name


def replayed_through(run_dir: Path) -> int | None:
    """The last step a resume rolled back (``metrics.rolled_back.jsonl``), None if none.

    Why: those steps reached the trackers before the run was killed, and are replayed now.
    """
    last: int | None = None
    try:
        with open(rolled_back_path(run_dir / "metrics.jsonl"), encoding="utf-8") as f:
            for line in f:
                try:
                    step = json.loads(line).get("step")
                except (ValueError, AttributeError):
                    continue  # a torn or foreign line
                if isinstance(step, int) and not isinstance(step, bool):
                    last = step if last is None else max(last, step)
    except OSError:
        return None
    return last


class _Backend(Protocol):
    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def note(self, step: int, tag: str, text: str) -> None: ...

    def close(self) -> None: ...


class _TensorBoard:
    """``torch.utils.tensorboard.SummaryWriter`` into ``<run>/tensorboard``."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any], resume_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step hides events of the steps a resume replays, so curves do not fold back
        purge = resume_step + 1 if resume_step is not None else None
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge)
        if purge is None or purge == 0:  # a fresh run, or one replayed from its start
            lines = "\n".join(f"    {k}: {v!r}" for k, v in config.items())
            self.writer.add_text("config", lines)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def note(self, step: int, tag: str, text: str) -> None:
        """Text in the Text tab at ``step`` (markdown: the fix's line break kept)."""
        self.writer.add_text(tag, text.replace("\n", "  \n"), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Trackio:
    """A local trackio run (``trackio show`` opens the dashboard), resumed by run name.

    trackio cannot delete a step's points, so after a resume the steps it logged before the
    kill (``logged_through``) are not logged again: a second point at the same step would
    fold the curve back. As with W&B, it keeps their first values (``metrics.jsonl`` and
    TensorBoard have the replayed ones).
    """

    def __init__(
        self, project: str, name: str, config: Mapping[str, Any], logged_through: int | None
    ):
        self.trackio = importlib.import_module("trackio")
        self.logged_through = logged_through
        self.trackio.init(project=project, name=name, config=dict(config), resume="allow")

    def log(self, step: int, values: Mapping[str, float]) -> None:
        if self.logged_through is not None and step <= self.logged_through:
            return
        self.trackio.log(dict(values), step=step)

    def note(self, step: int, tag: str, text: str) -> None:
        """Nothing: trackio logs numbers (the ``health/reported`` curve shows a finding)."""

    def close(self) -> None:
        self.trackio.finish()


class _WandB:
    """A W&B run in ``<run>/wandb``; offline unless ``WANDB_MODE``/``WANDB_API_KEY`` say so.

    The run id is kept in ``<run>/wandb_id`` so a resumed training run continues the same W&B
    run. W&B ignores steps lower than ones it has seen: replayed steps after a resume are
    dropped there (``metrics.jsonl`` has them).
    """

    def __init__(self, project: str, run_dir: Path, config: Mapping[str, Any]):
        wandb = importlib.import_module("wandb")
        id_file = run_dir / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        mode = os.environ.get("WANDB_MODE") or (
            "online" if os.environ.get("WANDB_API_KEY") else "offline"
        )
        self.run = wandb.init(
            project=project, name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir),
            config=dict(config), mode=mode,
        )  # fmt: skip

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def note(self, step: int, tag: str, text: str) -> None:
        """In the run's summary (its Overview page), with the step it showed at."""
        self.run.summary[tag] = f"step {step}: {text}"

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The trackers ``report_to`` names, fed the same scalars every step.

    Args:
        report_to: ``GRPOConfig.report_to`` (``["auto"]``, ``["none"]``, or backend names).
        run_dir: the run folder; TensorBoard and W&B write below it.
        config: the resolved config, recorded by each tracker.
        project: the trackio / W&B project name.
        resume_step: the checkpoint step a resumed run continues after (TensorBoard hides
            its events after that step, since they are replayed). None for a fresh run.

    Raises:
        ConfigError: see `resolve_report_to`; or a backend failed to start.
    """

    def __init__(
        self,
        report_to: str | Sequence[str],
        run_dir: str | os.PathLike[str],
        config: Mapping[str, Any],
        *,
        project: str = "agentgym",
        resume_step: int | None = None,
    ) -> None:
        self.names = resolve_report_to(report_to)
        run_dir = Path(run_dir)
        self._backends: dict[str, _Backend] = {}
        try:
            for name in self.names:
                self._backends[name] = self._start(name, run_dir, config, project, resume_step)
        except Exception as exc:
            self.close()
            raise ConfigError(
                f"tracker {name!r} could not start: {exc}; fix it or drop it from report_to"
            ) from exc

    @staticmethod
    def _start(
        name: str, run_dir: Path, config: Mapping[str, Any], project: str, resume: int | None
    ) -> _Backend:
        if name == "tensorboard":
            return _TensorBoard(run_dir, config, resume)
        if name == "trackio":
            replayed = replayed_through(run_dir) if resume is not None else None
            return _Trackio(project, trackio_run_name(run_dir), config, replayed)
        return _WandB(project, run_dir, config)

    @property
    def active(self) -> list[str]:
        """Backends still logging (a failed one is dropped)."""
        return list(self._backends)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Send the numeric values of ``metrics`` to every active backend at ``step``."""
        values = scalars(metrics)
        self._each(step, lambda backend: backend.log(step, values))

    def note(self, step: int, tag: str, text: str) -> None:
        """A line of text at ``step`` (a health finding) where the backend shows text.

        TensorBoard: its Text tab under ``tag``; W&B: the run's summary; trackio: nothing.
        """
        self._each(step, lambda backend: backend.note(step, tag, text))

    def _each(self, step: int, send: Callable[[_Backend], None]) -> None:
        for name, backend in list(self._backends.items()):
            try:
                send(backend)
            except Exception as exc:
                log.warning("tracker %s failed at step %d and is switched off: %s", name, step,
                            exc)  # fmt: skip
                del self._backends[name]

    def close(self) -> None:
        """Flush and close every backend; safe to call twice."""
        for name, backend in list(self._backends.items()):
            try:
                backend.close()
            except Exception as exc:
                log.warning("tracker %s did not close cleanly: %s", name, exc)
        self._backends.clear()

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- console -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One number on the console line: ``label`` then ``key``'s value in ``fmt``.

    ``spread`` is a key shown after the value as ``±spread`` (e.g. ``reward/std``); ``keys``
    given as a tuple are summed (e.g. low and high clip ratios). Absent keys are not shown.
    """

    label: str
    keys: str | tuple[str, ...]
    fmt: str
    spread: str | None = None

    def render(self, metrics: Mapping[str, float]) -> str | None:
        keys = (self.keys,) if isinstance(self.keys, str) else self.keys
        present = [metrics[k] for k in keys if k in metrics]
        if not present:
            return None
        text = f"{self.label} {self.fmt.format(sum(present))}"
        if self.spread is not None and self.spread in metrics:
            text += f"±{self.fmt.format(metrics[self.spread])}"
        return text


#: What the console shows, in order (the trainer's metric names).
CONSOLE_FIELDS: tuple[Field, ...] = (
    Field("reward", "reward/mean", "{:.3f}", spread="reward/std"),
    Field("success", "reward/success", "{:.0%}"),
    Field("eval", "eval/success", "{:.0%}"),
    Field("kl", "loss/kl", "{:.4f}"),
    Field("clip", ("loss/clip_ratio_low", "loss/clip_ratio_high"), "{:.1%}"),
    Field("entropy", "loss/entropy", "{:.3f}"),  # a collapse shows here first
    Field("coef", "loss/entropy_coef", "{:.3f}"),  # with an entropy bonus (adaptive or not)
    Field("len", "rollout/completion_length", "{:.0f}"),
    Field("rollout", "time/rollout", "{:.1f}s"),
    Field("train", "time/train", "{:.1f}s"),
    Field("sync", "time/sync", "{:.2f}s"),
)


def format_metrics(metrics: Mapping[str, Any], fields: Sequence[Field] = CONSOLE_FIELDS) -> str:
    """The compact one-line summary of a step, e.g. ``reward 0.412±0.210  kl 0.0031 ...``."""
    values = {k: v for k, v in scalars(metrics).items() if math.isfinite(v)}
    parts = [text for f in fields if (text := f.render(values)) is not None]
    return "  ".join(parts)


class TrainingConsole:
    """A rich progress bar over ``max_steps`` with the last step's numbers beside it.

    The line shows `CONSOLE_FIELDS`. Persistent lines (which stay in a scrolled terminal or a
    CI log, where the live bar does not render) are printed about 20 times in a run (every
    ``max(1, max_steps // 20)`` steps), at every step that has eval numbers, and at the last
    step. Why not every ``logging_steps``-th step: that knob paces the trackers and defaults
    to every step, which would print a line per step beside the live bar.

    Args:
        max_steps: the step count the bar runs to.
        start_step: steps already done (a resumed run).
        console: a `rich.console.Console` (tests pass one that records); None: stderr.
    """

    def __init__(self, max_steps: int, *, start_step: int = 0, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.max_steps = max_steps
        #: Steps between persistent lines.
        self.log_every = max(1, max_steps // 20)
        self.console = console if console is not None else Console(stderr=True, markup=False)
        self._progress = Progress(
            TextColumn("GRPO", style="bold"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TimeElapsedColumn(), TimeRemainingColumn(),
            TextColumn("{task.fields[line]}", markup=False),
            # a log or a pipe gets the persistent lines only: the bar's last frame, printed
            # once there, is cut to the width and repeats the last step's line
            console=self.console, transient=not self.console.is_terminal,
        )  # fmt: skip
        self._task = self._progress.add_task("grpo", total=max_steps, completed=start_step,
                                             line="")  # fmt: skip
        self._started = False

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Show ``step``'s numbers; print a persistent line when one is due."""
        if not self._started:
            self._progress.start()
            self._started = True
        line = format_metrics(metrics)
        self._progress.update(self._task, completed=step, line=line)
        has_eval = any(k.startswith("eval/") for k in metrics)
        if step % self.log_every == 0 or has_eval or step >= self.max_steps:
            self._progress.console.print(f"step {step:>{len(str(self.max_steps))}}/"
                                         f"{self.max_steps}  {line}", highlight=False)  # fmt: skip
        if step >= self.max_steps:
            self.close()

    def close(self) -> None:
        """Stop the live display; safe to call twice."""
        if self._started:
            self._progress.stop()
            self._started = False

    def __enter__(self) -> TrainingConsole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
