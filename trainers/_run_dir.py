"""`RunDir`: one folder per training run, written so that ``kill -9`` at any moment loses nothing.

Layout::

    <output_dir>/
      config.yaml                          the resolved config; a resume must match it
      status.json                          running | finished | failed, pid, host, times, step
      metrics.jsonl                        one JSON object per line: {"step": N, "time": t, ...}
      eval_trajectories.jsonl              eval episodes, one per line, step in info["step"]
      rollouts.jsonl                       training episodes of logged steps (log_completions)
      metrics.rolled_back.jsonl            lines of steps a resume went back over (replayed)
      eval_trajectories.rolled_back.jsonl  the same for eval episodes (rollouts.rolled_back.jsonl)
      checkpoints/step-000040/             adapter/, optimizer.pt, rng.pt, trainer_state.json
      adapters/v12/                        adapter versions handed to the running engine
      train.log                            the ``agentgym`` logger while the run is open

Crash-safety contract:

- JSONL lines are flushed and fsynced by each call, so a kill loses at most the line being
  written; its torn remainder (no newline) is cut off when the run is reopened.
- Folders (checkpoints, adapters) are written under a hidden temporary name, fsynced, then
  renamed: a folder with its final name is complete. Leftover temporary folders are removed.
- The loop writes everything of step N (metrics, episodes) before `save_checkpoint` (N).
  A resume continues after the last complete checkpoint and moves the lines of later steps
  to the ``*.rolled_back.jsonl`` files (those steps are replayed, so their lines would
  otherwise appear twice); nothing is deleted.

Example::

    from agentgym.trainers._training_state import load_training_state

    run = RunDir(config.output_dir, config.to_dict(), resume=args.resume)  # rolled back already
    checkpoint = run.latest_checkpoint() if run.resumed else None
    state = load_training_state(checkpoint, model, optim) if checkpoint else None
    for step in range(start, max_steps + 1):
        ...
        run.write_metrics(step, metrics)
        run.save_checkpoint(step, model, optim, {"adapter_version": version})
    run.mark_finished()
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import re
import shutil
import socket
import traceback
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym import Trajectory
from agentgym._durable import (
    atomic_write_text,
    check_folder_can_be_made,
    fsync_dir,
    remove_temp_files,
)
from agentgym._errors import ConfigError, Error
from agentgym._pid import process_alive
from agentgym._trajectory import to_json_line
from agentgym.engine._model_dir import _safetensors_whole, model_folder_problem
from agentgym.runs._folder import (
    RUN_FILES,
    SFT_SUMMARY,
    refuse_another_kind_of_run,
    remove_spent_sft_checkpoint,
)

from ._training_state import (
    refuse_damaged_checkpoint,
    save_adapter_files,
    write_failure,
    write_training_state,
)

log = logging.getLogger(__name__)

#: Config keys a resume may change: they schedule the run, they do not change what it learns.
#: ``max_steps`` only while the learning rate does not depend on it (`_refuse_rescheduled`:
#: 'linear' and 'cosine' decay to 0 at it, a fractional ``warmup_steps`` is a share of it).
#: ``output_dir`` is here because the same folder can be spelled differently;
#: ``episode_deadline_s`` and ``infra_error_patience`` because a run they stopped says to
#: raise them and resume (they decide how long a step waits and when the run gives up).
#: ``vllm_gpu_memory_utilization`` (the engine's KV cache) and ``max_concurrency`` (episodes in
#: flight) because a run out of memory is resumed with them lowered: each episode's and each
#: turn's seed comes from its place in the step's plan, and the episodes come back in plan
#: order, however many play at once (`arollout`).
RESUMABLE_KEYS = frozenset(
    {"max_steps", "eval_steps", "save_steps", "save_total_limit", "logging_steps", "report_to",
     "log_completions", "output_dir", "episode_deadline_s", "infra_error_patience",
     "vllm_gpu_memory_utilization", "max_concurrency"}
)
#: Config keys that only decide how a step's samples are cut into forward/backward passes, so
#: an out-of-memory run is resumed with them: the loss's normalisers count the whole step, so
#: the update is the same however the samples are cut (tests/trainers/test_distributed.py) ...
#: except where ``top_entropy_quantile`` < 1 takes its quantile over each pass's tokens.
PASS_KEYS = frozenset({"micro_batch_tokens", "gradient_accumulation_steps",
                       "gradient_checkpointing"})  # fmt: skip
#: The run folder's SFT warm start (``sft/``): the base model its adapters were trained on.
WARM_START = "sft"
_CHECKPOINT = re.compile(r"^step-(\d{6,})$")
_ADAPTER = re.compile(r"^v(\d+)$")
_TEMP_PREFIXES = (".tmp-", ".old-")


class CheckpointWriteError(Error):
    """A checkpoint could not be written (a full disk ...): the run stops, `--resume` goes on.

    Why its own error: torch's and safetensors' failures on a full disk ended the run with a
    traceback of some 140 lines; the CLI prints an `Error` as one line.
    """


class RunDir:
    """A run's folder: config, status, metrics, eval episodes, checkpoints and adapters.

    Args:
        path: the run folder (``GRPOConfig.output_dir``); created when missing.
        config: the resolved config (``GRPOConfig.to_dict()``), saved as ``config.yaml``.
        resume: continue the run already in ``path``. Without it, a folder that holds a run
            is refused. With it, a folder without a run starts fresh.
        keep: complete checkpoints kept (the newest ones); at least 1, or None for all.
        keep_adapters: adapter versions kept in ``adapters/``; must exceed the engine's
            ``max_loras`` (vLLM re-reads an evicted adapter's folder if it is asked again).

    Attributes:
        resumed: True when the run continues from a checkpoint (`resume_step`). False for a
            fresh run, including ``resume=True`` on a folder without a run or on a run killed
            before its first checkpoint (its lines were rolled back: it starts over).
        resume_step: the step of the checkpoint the run continues after, else None.

    Raises:
        ConfigError: the folder holds a run and ``resume`` is False; the saved config differs
            outside `RESUMABLE_KEYS`; another live process is writing the run.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        config: Mapping[str, Any],
        *,
        resume: bool = False,
        keep: int | None = 2,
        keep_adapters: int = 4,
        defaults: Mapping[str, Any] | None = None,
        tasks_sha256: str | None = None,
    ) -> None:
        if (keep is not None and keep < 1) or keep_adapters < 1:
            raise ConfigError(f"keep={keep} and keep_adapters={keep_adapters} must be >= 1")
        self.path = Path(path)
        self.keep = keep
        self.keep_adapters = keep_adapters
        self.config = _normalise(config)
        self.resumed = False
        self.resume_step: int | None = None
        taken_over = _failed_before_any_step(self.path)
        previous = self.check_open(self.path, self.config, resume=resume, defaults=defaults,
                                   tasks_sha256=tasks_sha256)  # fmt: skip
        existing = previous is not None
        #: The folder held a run before (resumed from a checkpoint or, with none, from the start).
        self.reopened = existing
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints_dir.mkdir(exist_ok=True)
        self._log_level = logging.getLogger("agentgym").level
        self._log_handler: logging.Handler | None = _attach_log_file(self.log_path)
        if existing:
            self._go_back_to_checkpoint()
        atomic_write_text(self.config_path, _dump_yaml(self.config))
        self._status = _new_status(previous or {}, self.resume_step) | {
            "tasks_sha256": tasks_sha256
        }
        if previous is None and taken_over is not None:  # its failure stays on record
            self._status["taken_over"] = _previous_record(taken_over)
        self._write_status()

    @property
    def run_id(self) -> str:
        """An id made when the run started and kept when it resumes."""
        return str(self._status["run_id"])

    # ---- paths --------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        """``config.yaml``: the resolved config."""
        return self.path / "config.yaml"

    @property
    def status_path(self) -> Path:
        """``status.json``: state, pid, host, times, last step, exit info."""
        return self.path / "status.json"

    @property
    def metrics_path(self) -> Path:
        """``metrics.jsonl``: one ``{"step": N, "time": t, ...}`` object per line."""
        return self.path / "metrics.jsonl"

    @property
    def eval_path(self) -> Path:
        """``eval_trajectories.jsonl``: eval episodes, ``info["step"]`` set."""
        return self.path / "eval_trajectories.jsonl"

    @property
    def rollouts_path(self) -> Path:
        """``rollouts.jsonl``: training episodes (`append_rollouts`), ``info["step"]`` set."""
        return self.path / "rollouts.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        """``checkpoints/``: ``step-NNNNNN`` folders."""
        return self.path / "checkpoints"

    @property
    def adapters_dir(self) -> Path:
        """``adapters/``: ``vN`` folders, the adapter versions synced into the engine."""
        return self.path / "adapters"

    @property
    def log_path(self) -> Path:
        """``train.log``: records of the ``agentgym`` logger while the run is open."""
        return self.path / "train.log"

    @staticmethod
    def holds_run(path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` already holds a run (config, status, metrics or checkpoints)."""
        return any((Path(path) / name).exists() for name in RUN_FILES["train"])

    @classmethod
    def check_open(
        cls,
        path: str | os.PathLike[str],
        config: Mapping[str, Any],
        *,
        resume: bool = False,
        defaults: Mapping[str, Any] | None = None,
        tasks_sha256: str | None = None,
    ) -> dict[str, Any] | None:
        """Make the refusals opening ``path`` would make, touching nothing (a dry run's check).

        Returns the saved status of the run it would reopen (``{}`` if it has none), or None
        when a new run would start there: also over a run that failed before finishing a step
        (it left nothing to resume, and a corrected rerun was refused in both ways). Raises
        `ConfigError` as the constructor does.
        """
        path = Path(path)
        check_folder_can_be_made(path, "output_dir")
        refuse_another_kind_of_run(path, "train", "output_dir")
        if not cls.holds_run(path):
            if resume:  # a mistyped output_dir would otherwise restart quietly
                log.warning("--resume: %s holds no run; starting a new one there", path)
            return None
        failed = _failed_before_any_step(path)
        if failed is not None:
            log.warning("%s holds a run that failed before finishing a step (%s); starting a "
                        "new run there", path, _exit_error(failed))  # fmt: skip
            return None
        if not resume:
            raise ConfigError(
                f"{path} already holds a run ({_describe_run(path)}); pass --resume to "
                "continue it, or choose a new output_dir (in Python: GRPOTrainer(config, "
                "resume=True))"
            )
        _refuse_changed_config(path, _normalise(config), defaults)
        previous = _read_status(path)
        _refuse_live_owner(path, previous)
        _refuse_other_tasks(path, previous.get("tasks_sha256"), tasks_sha256)
        _refuse_fewer_steps(path, config.get("max_steps"), previous)
        _refuse_damaged_newest_checkpoint(path)
        _refuse_damaged_warm_start(path, bool(checkpoints_by_step(path)))
        return previous

    @staticmethod
    def finished_figures(
        path: str | os.PathLike[str],
        max_steps: int,
        config: Mapping[str, Any],
        defaults: Mapping[str, Any] | None = None,
    ) -> dict[str, float] | None:
        """The headline figures of a run that finished ``max_steps`` in ``path``; else None.

        Such a run has nothing to resume: resuming it would only run its final eval again. A
        finished run resumed with a larger ``max_steps`` trains on, so it gets None.
        """
        check_folder_can_be_made(Path(path), "output_dir")  # a file there: not "cannot read"
        status = _read_status(Path(path))
        if status.get("state") != "finished" or (status.get("step") or 0) < max_steps:
            return None  # its summary.json, if any, is rewritten: a killed one's is not read
        summary = _read_object(Path(path) / "summary.json", "delete it: the resume writes it again")
        if "figures" not in summary:
            return None
        _refuse_changed_config(Path(path), _normalise(config), defaults)  # as a resume would
        _refuse_fewer_steps(Path(path), max_steps, status)  # its figures are of a later step
        return dict(summary["figures"])

    # ---- opening an existing run ---------------------------------------------------------
    def _go_back_to_checkpoint(self) -> None:
        """Clear a killed run's leftovers, repair torn files, roll back past the checkpoint.

        Leftovers: temp files a kill left mid-write (never renamed), the old engine's
        adapters, and a warm start's checkpoint (``sft.partial/``) a kill left beside its
        saved model: spent, and as large as the model with its optimiser state.
        """
        left = [*remove_temp_files(self.path), *remove_temp_files(self.path / WARM_START)]
        if spent := remove_spent_sft_checkpoint(self.path / WARM_START):
            left.append(spent)
        for path in left:
            log.warning("removed %s, left by a killed run", path)
        for path in (self.metrics_path, self.eval_path, self.rollouts_path):
            cut = _cut_torn_tail(path)
            if cut:
                log.warning("%s: cut a torn last line (%d bytes) left by a killed run", path, cut)
        shutil.rmtree(self.adapters_dir, ignore_errors=True)  # the old engine's, see save_adapter
        checkpoint = self.latest_checkpoint()
        if checkpoint is not None:
            state = _read_object(checkpoint / "trainer_state.json", "delete that checkpoint folder")
            self.resume_step = int(state["step"])
            self.resumed = True
        after = self.resume_step if self.resume_step is not None else -1
        moved = self.rollback(after)
        where = f"checkpoint step {after}" if self.resumed else "the start (no checkpoint)"
        log.info("resuming %s from %s; moved %d lines of later steps aside", self.path, where,
                 moved)  # fmt: skip

    # ---- JSONL streams -------------------------------------------------------------------
    def write_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append ``{"step": step, "time": <unix s>, **metrics}`` to ``metrics.jsonl``, fsynced.

        Tensors and numpy scalars become numbers; a ``"step"`` key in ``metrics`` is refused.
        """
        if "step" in metrics:
            raise ValueError("metrics must not hold a 'step' key; it is passed as `step`")
        record = {"step": step, "time": round(_now(), 3), **metrics}
        _append_lines(self.metrics_path, [json.dumps(record, default=_json_default) + "\n"])
        self._status["step"] = max(step, self._status.get("step") or 0)
        self._write_status()

    def append_eval(
        self, step: int, trajectories: Sequence[Trajectory], label: str = "eval"
    ) -> None:
        """Append eval episodes to ``eval_trajectories.jsonl`` with ``info["step"] = step``.

        ``info["eval"] = label`` says which eval they belong to (``final`` is the one after
        the last step). The caller's trajectories are not modified.
        """
        _append_lines(self.eval_path, _episode_lines(trajectories, step=step, eval=label))

    def append_rollouts(self, step: int, trajectories: Sequence[Trajectory]) -> None:
        """Append a step's training episodes to ``rollouts.jsonl`` with ``info["step"] = step``.

        What the policy did for its reward, to read beside the metrics (a reward hack shows
        there before it shows in the held-out figures). The caller's trajectories are not
        modified.
        """
        _append_lines(self.rollouts_path, _episode_lines(trajectories, step=step))

    def rollback(self, after_step: int) -> int:
        """Move lines of steps ``> after_step``, and the final eval's, to ``*.rolled_back.jsonl``.

        Called when the run reopens (steps after the checkpoint will be replayed, and the final
        eval always runs again: the last checkpoint is written before it); idempotent. Returns
        the number of lines moved.
        """
        moved = _move_lines(
            self.metrics_path,
            lambda r: r["step"] > after_step or any(k.startswith(f"{FINAL}/") for k in r),
        )
        moved += _move_lines(
            self.eval_path,
            lambda r: r["info"]["step"] > after_step or r["info"].get("eval") == FINAL,
        )
        moved += _move_lines(self.rollouts_path, lambda r: r["info"]["step"] > after_step)
        return moved

    def headline_figures(self, start: str) -> dict[str, float]:
        """The success figures a resumed run measured before its first step.

        They are measured once (the base model's before SFT, ``base/success``; the step-0 eval,
        reported as ``start``), so a resume does not measure them again and its summary takes
        them from ``metrics.jsonl``.
        """
        return figures_before_training(read_jsonl_records(self.metrics_path), start)

    # ---- checkpoints ---------------------------------------------------------------------
    def save_checkpoint(
        self, step: int, model: Any, optimizer: Any, extra: Mapping[str, Any] | None = None
    ) -> Path:
        """Write ``checkpoints/step-{step:06d}/`` atomically; keep the newest `keep` of them.

        Holds ``adapter/`` (``model.save_pretrained``: the PEFT adapter, loadable by vLLM),
        ``optimizer.pt``, ``rng.pt`` (python, numpy, torch and CUDA generators) and
        ``trainer_state.json`` = ``{"step": step, **extra}`` (JSON values only: e.g. the
        adapter version, data-order position). Generators other than the global ones are the
        caller's to store in ``extra`` or derive from the step.
        """
        extra = dict(extra or {})
        if "step" in extra:
            raise ValueError("extra must not hold a 'step' key; it is passed as `step`")
        state_text = json.dumps({"step": step, **extra}, indent=1)  # non-JSON extra fails here
        final = self.checkpoints_dir / f"step-{step:06d}"
        try:
            with atomic_dir(final) as tmp:
                write_training_state(tmp, model, optimizer, state_text)
        except Exception as exc:  # only write failures: anything else stays as it was
            why = write_failure(exc)
            if why is None:
                raise
            done = self._status.get("checkpoint_step")
            kept = f"step {done}" if done is not None else "none yet: it starts over"
            raise CheckpointWriteError(
                f"could not write the checkpoint of step {step} in {self.checkpoints_dir} "
                f"({why}); once fixed, run the same command with --resume: it continues from "
                f"the last complete checkpoint ({kept})"
            ) from exc
        complete = self._checkpoints()  # also clears a killed save's temporary folders
        for old in complete[: -self.keep] if self.keep else ():
            shutil.rmtree(old)
        self._status["checkpoint_step"] = step
        self._write_status()
        return final

    def _checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first; removes leftover temporary folders."""
        _remove_temp_dirs(self.checkpoints_dir)
        return complete_checkpoints(self.path)

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint folder, or None (half-written ones are removed)."""
        if not self.checkpoints_dir.is_dir():
            return None
        checkpoints = self._checkpoints()
        return checkpoints[-1] if checkpoints else None

    # ---- adapters for the engine ---------------------------------------------------------
    def adapter_dir(self, version: int) -> Path:
        """Where adapter version ``version`` is saved for the engine: ``adapters/v{version}``."""
        return self.adapters_dir / f"v{version}"

    def save_adapter(self, model: Any, version: int) -> Path:
        """Save the PEFT adapter atomically as ``adapters/v{version}``; returns its folder.

        Keeps the newest `keep_adapters` versions. The folder belongs to the running engine:
        reopening the run clears ``adapters/`` (a new engine starts numbering again; the
        checkpoints hold the durable copies), so it is renamed into place but not fsynced,
        and holds only what vLLM reads (``adapter_config.json``, ``adapter_model.safetensors``;
        no model card): this is on every step's sync path.
        """
        self.adapters_dir.mkdir(exist_ok=True)
        final = self.adapter_dir(version)
        with atomic_dir(final, durable=False) as tmp:  # a cache: a resume clears it anyway
            save_adapter_files(model, tmp)
        versions = sorted(
            (int(m.group(1)), p)
            for p in self.adapters_dir.iterdir()
            if (m := _ADAPTER.match(p.name))
        )
        for _, old in versions[: -self.keep_adapters]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    # ---- status --------------------------------------------------------------------------
    def mark_finished(self) -> None:
        """Record a clean end (``state: finished``) and detach the log file."""
        self._end("finished", None)

    def mark_failed(self, error: BaseException) -> None:
        """Record a failure (``state: failed``, the error and its traceback's tail)."""
        self._end("failed", error)

    def mark_interrupted(self, stop: BaseException) -> None:
        """Record a stop asked for (Ctrl-C, ``kill PID``): ``state: interrupted``.

        Why not ``failed``: nothing went wrong, and a reader of the folder (``runs``, a
        teammate) should know the run is meant to go on with ``--resume``.
        """
        self._end("interrupted", stop)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._end("failed" if exc is not None else "finished", exc)

    @property
    def status(self) -> dict[str, Any]:
        """A copy of what ``status.json`` holds."""
        return dict(self._status)

    def _end(self, state: str, error: BaseException | None) -> None:
        self._status["state"] = state
        self._status["ended_at"] = _iso_now()
        if error is not None:
            tail = traceback.format_exception(type(error), error, error.__traceback__)[-6:]
            self._status["exit"] = {
                "error": f"{type(error).__name__}: {error}",
                "traceback": "".join(tail),
            }
        else:
            self._status["exit"] = {"error": None}
        self._write_status()
        if self._log_handler is not None:
            logger = logging.getLogger("agentgym")
            logger.removeHandler(self._log_handler)
            logger.setLevel(self._log_level)
            self._log_handler.close()
            self._log_handler = None

    def _write_status(self) -> None:
        self._status["updated_at"] = _iso_now()
        atomic_write_text(self.status_path, json.dumps(self._status, indent=1) + "\n")


# ---- reading -------------------------------------------------------------------------------

#: The label of the eval after the last step (its metrics are ``final/*``).
FINAL = "final"


def _episode_lines(trajectories: Sequence[Trajectory], **info: Any) -> list[str]:
    """JSONL lines of ``trajectories`` with ``info`` added to each one's own."""
    return [to_json_line(dataclasses.replace(t, info={**t.info, **info})) for t in trajectories]


def figures_before_training(
    records: Iterable[Mapping[str, Any]], start: str
) -> dict[str, float]:
    """``base/success`` and the step-0 eval's success (named ``start``) of a run's metrics."""
    figures: dict[str, float] = {}
    for record in records:
        if "base/success" in record:
            figures["base/success"] = record["base/success"]
        if record["step"] == 0 and "eval/success" in record:
            figures[start] = record["eval/success"]
    return figures


def read_jsonl_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, skipping a torn last line; [] if it is missing.

    A line before the last that is not a JSON object is no kill's doing (a hand edit, a lost
    disk block): `ConfigError` names it and the fix, where a report, an export or a doctor
    of the run died with a JSON traceback. (A resumed run moves such lines aside itself.)
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    records = []
    for number, line in enumerate(data[: data.rfind(b"\n") + 1].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:  # UnicodeDecodeError is one too
            record, why = None, f"not JSON: {getattr(exc, 'msg', exc)}"
        else:
            why = f"a JSON {type(record).__name__}, not an object"
        if not isinstance(record, dict):
            raise ConfigError(
                f"line {number} of {path} is not a record ({why}); the trainer writes whole "
                "lines: restore the file, or delete that line (resuming the run moves it aside)"
            )
        records.append(record)
    return records


def complete_checkpoints(run_path: str | os.PathLike[str]) -> list[Path]:
    """A run folder's complete checkpoints (``checkpoints/step-N``), oldest first."""
    return list(checkpoints_by_step(run_path).values())


def checkpoints_by_step(run_path: str | os.PathLike[str]) -> dict[int, Path]:
    """A run folder's complete checkpoints by step, oldest first.

    Reads only: a run still being written may be read from another process (`export_run`).
    """
    folder = Path(run_path) / "checkpoints"
    found = [
        (int(m.group(1)), p)
        for p in (folder.iterdir() if folder.is_dir() else ())
        if (m := _CHECKPOINT.match(p.name)) and (p / "trainer_state.json").is_file()
    ]
    return dict(sorted(found))


# ---- helpers: files --------------------------------------------------------------------------

_MISSING = object()


def _now() -> float:
    import time

    return time.time()


def _iso_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _json_default(value: Any) -> Any:
    """JSON for tensors and numpy values (``.item()``/``.tolist()``), else ``str``."""
    for method in ("item", "tolist"):
        with contextlib.suppress(Exception):
            return getattr(value, method)()
    return str(value)


def _normalise(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as YAML would read it back (tuples -> lists), for comparison with a saved one."""
    import yaml

    return dict(yaml.safe_load(_dump_yaml(dict(config))) or {})


def _dump_yaml(data: Mapping[str, Any]) -> str:
    import yaml

    return str(yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True))


def _read_object(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object in ``path``; {} when it is missing.

    Raises:
        ConfigError: it is not a JSON object (a damaged file), naming it and ``fix``.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} cannot be read as JSON ({exc}); {fix}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}, not a JSON object; {fix}")
    return data


def _read_status(path: Path) -> dict[str, Any]:
    """A run folder's ``status.json``, {} when it has none (see `_read_object`)."""
    return _read_object(path / "status.json", "delete it to resume: the run writes it again")


def _append_lines(path: Path, lines: Sequence[str]) -> None:
    """Append complete lines (each ending in a newline) and fsync."""
    if not lines:
        return
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(lines))
        f.flush()
        os.fsync(f.fileno())


def _cut_torn_tail(path: Path) -> int:
    """Cut an unterminated last line off ``path``; returns the bytes removed."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    keep = data.rfind(b"\n") + 1
    if keep == len(data):
        return 0
    with path.open("r+b") as f:
        f.truncate(keep)
        os.fsync(f.fileno())
    return len(data) - keep


def rolled_back_path(path: Path) -> Path:
    """Where a resume moves the lines of ``path`` it replays: ``<stem>.rolled_back.jsonl``."""
    return path.with_name(f"{path.stem}.rolled_back.jsonl")


def _move_lines(path: Path, moves: Any) -> int:
    """Move the lines whose JSON satisfies ``moves`` to ``<stem>.rolled_back.jsonl``.

    Order of writes: the moved lines are appended (fsynced) before ``path`` is replaced, so
    a crash in between duplicates lines at worst, never loses one. A line that is not a record
    of ``path`` (damaged: a kill only ever tears the last line, cut off before) is moved too,
    with a warning: it failed the resume with a traceback, and kept, it would fail readers.
    """
    if not path.is_file():
        return 0
    moved: list[bytes] = []
    kept: list[bytes] = []
    unreadable = 0
    for line in path.read_bytes().splitlines(keepends=True):
        verdict = _moves(line, moves)
        (kept if verdict is False else moved).append(line)
        unreadable += verdict is None
    if unreadable:
        log.warning("%s: %d line(s) cannot be read as its records; moved them to %s", path,
                    unreadable, rolled_back_path(path).name)  # fmt: skip
    if not moved:
        return 0
    _append_lines(rolled_back_path(path), [m.decode(errors="replace") for m in moved])
    atomic_write_text(path, b"".join(kept).decode(errors="replace"))
    return len(moved)


def _moves(line: bytes, moves: Any) -> bool | None:
    """Whether ``moves`` picks ``line``'s record; None when the line holds no such record."""
    if not line.strip():
        return False
    try:
        return bool(moves(json.loads(line)))
    except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, or not a record
        return None


@contextlib.contextmanager
def atomic_dir(
    final: Path, durable: bool = True, replace: bool = True, sweep: bool = False
) -> Iterator[Path]:
    """Yield a temp folder next to ``final``; on success rename it to ``final``.

    ``durable``: fsync the files and folders too, so the folder survives a power cut, not
    only a killed process. An existing ``final`` is replaced, unless ``replace`` is False:
    then `ConfigError` (another writer made it meanwhile). On an exception the temp folder
    is removed. ``sweep``: ``final`` lies where no run folder's reopening clears what a killed
    writer left (an export's OUT): first remove the temp folders of ``final`` that no live
    writer holds, and hold this one (`_claim_temp_dir`) until it is renamed.
    """
    tmp = final.with_name(f".tmp-{final.name}-{uuid.uuid4().hex[:8]}")
    held = _claim_temp_dir(final, tmp) if sweep else None
    if held is None:
        tmp.mkdir(parents=True, exist_ok=sweep)
    try:
        yield tmp
        if durable:
            fsync_tree(tmp)
        if final.exists() and not replace:
            raise ConfigError(f"{final} was made meanwhile (by another writer); not replaced")
        if final.exists():
            old = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:8]}")
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        if durable:
            fsync_dir(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if held is not None:
            os.close(held)  # releases the lock (the folder is renamed or gone by now)


def _claim_temp_dir(final: Path, tmp: Path) -> int | None:
    """Make ``tmp`` locked by this process, after removing ``final``'s abandoned temp folders.

    Returns the descriptor that holds the lock, or None where the file system cannot lock
    (then nothing is removed: a live writer could not be told from a dead one). The lock is
    `fcntl.flock` on the folder, as an eval's ``--out`` is locked (`FolderLock`): the kernel
    drops it when its process ends, even by ``kill -9``, so a folder nobody holds was left by
    a dead writer. Both steps happen under a lock on the parent folder, so a second writer of
    ``final`` never finds this folder made and not yet locked.
    """
    import fcntl

    tmp.parent.mkdir(parents=True, exist_ok=True)
    parent = os.open(tmp.parent, os.O_RDONLY)
    try:
        fcntl.flock(parent, fcntl.LOCK_EX)  # held for a sweep and a mkdir: short
        _remove_abandoned_temp_dirs(tmp.parent, final.name)
        tmp.mkdir()
        return _locked(tmp)
    except OSError:  # no locks here (some NFS mounts): write unlocked, sweep nothing
        return None
    finally:
        os.close(parent)  # releases the parent's lock


def _locked(folder: Path) -> int:
    """A descriptor of ``folder`` holding its `fcntl.flock` (BlockingIOError: another's)."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def _remove_abandoned_temp_dirs(parent: Path, final_name: str) -> None:
    """Remove the ``.tmp-<final_name>-xxxxxxxx`` folders in ``parent`` that no process holds.

    Only ``final_name``'s: another OUT's (``out-b`` beside ``out``) is its own writer's to clear.
    """
    own = re.compile(re.escape(f".tmp-{final_name}-") + r"[0-9a-f]{8}")
    for folder in parent.iterdir():
        if not own.fullmatch(folder.name) or not folder.is_dir():
            continue
        try:
            os.close(_locked(folder))  # taken: its writer is dead (new ones wait on parent)
        except OSError:  # BlockingIOError: a live writer's; or not this process's to judge
            continue
        log.warning("removing %s, left by a writer that was killed", folder)
        shutil.rmtree(folder, ignore_errors=True)


def fsync_tree(root: Path) -> None:
    """Make every file and folder under ``root`` durable (before a rename or a marker file)."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))


def _remove_temp_dirs(parent: Path) -> None:
    """Remove half-written folders (``.tmp-*``, ``.old-*``) a killed writer left."""
    if parent.is_dir():
        for p in parent.iterdir():
            if p.name.startswith(_TEMP_PREFIXES):
                shutil.rmtree(p, ignore_errors=True)


# ---- helpers: status and ownership -----------------------------------------------------------


def _new_status(previous: Mapping[str, Any], resume_step: int | None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "state": "running",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": _iso_now(),
        "updated_at": _iso_now(),
        "step": resume_step,
        "checkpoint_step": resume_step,
        "attempt": int(previous.get("attempt", 0)) + 1,
        # kept across resumes: names this run's adapters on long-lived rollout servers
        "run_id": previous.get("run_id") or uuid.uuid4().hex[:12],
    }
    if previous:
        status["previous"] = _previous_record(previous)
    return status


def _previous_record(previous: Mapping[str, Any]) -> dict[str, Any]:
    """What a new status keeps of the one it replaces: state, pid, last step, exit."""
    before = previous.get("state")
    return {
        "state": "killed" if before == "running" else before,
        "pid": previous.get("pid"),
        "step": previous.get("step"),
        "exit": previous.get("exit"),
    }


def _exit_error(status: Mapping[str, Any]) -> str:
    """The error a failed run recorded, for the line that says its folder is taken over."""
    exit_info = status.get("exit")
    error = exit_info.get("error") if isinstance(exit_info, dict) else None
    return str(error or "no error recorded")


#: What a run that failed before finishing a step may leave, besides empty files: taking it
#: over rewrites ``config.yaml`` and ``status.json`` (keeping the failure in ``taken_over``),
#: appends to ``train.log`` and replaces ``adapters/`` (the engine's cache).
_LEFT_BEFORE_A_STEP = frozenset({"config.yaml", "status.json", "train.log", "adapters",
                                 "checkpoints"})  # fmt: skip


def _failed_before_any_step(path: Path) -> dict[str, Any] | None:
    """The status of a run in ``path`` that failed or was stopped before a step, else None.

    Why: a run that failed while loading (a damaged model folder the dry run cannot see) left
    a folder that refused the corrected rerun without ``--resume`` and, its config having
    changed, with it too. Such a folder holds no step, no checkpoint and no line: nothing a
    new run there could lose. Anything else in it keeps the usual refusals.
    """
    try:
        status = _read_status(path)
    except ConfigError:
        return None  # a damaged status: the refusals name it
    if status.get("state") not in ("failed", "interrupted") or status.get("step") is not None:
        return None
    if complete_checkpoints(path) or not (path / "config.yaml").is_file():
        return None
    others = [p for p in path.iterdir() if p.name not in _LEFT_BEFORE_A_STEP]
    return status if all(p.is_file() and p.stat().st_size == 0 for p in others) else None


def _refuse_damaged_newest_checkpoint(path: Path) -> None:
    """Refuse to resume from a newest checkpoint whose files cannot be loaded.

    Checked where the checkpoint is chosen, before any model loads, so a dry run says it too.
    Its files are the user's to delete (nothing is removed here): the run then resumes from
    the checkpoint before it.
    """
    steps = sorted(checkpoints_by_step(path).items())
    if not steps:
        return
    newest = steps[-1][1]
    instead = (f"resume after step {steps[-2][0]} (the checkpoint before it)" if len(steps) > 1
               else "run again from step 1 (it has no older checkpoint)")  # fmt: skip
    refuse_damaged_checkpoint(newest, f"{newest.relative_to(path)} of {path}", instead)


def _refuse_damaged_warm_start(path: Path, has_checkpoints: bool) -> None:
    """Refuse to resume on an SFT warm start (``sft/``) whose weight files are cut short.

    Why: the run reuses ``sft/`` whenever its ``sft.json`` is there, so a truncated
    ``model.safetensors`` passed the dry run and failed the resume with a traceback once the
    engine loaded it. Headers and sizes only, as a checkpoint's adapter is checked.
    """
    folder = path / WARM_START
    if not (folder / SFT_SUMMARY).is_file():
        return  # none, or one the run has yet to finish: it is (re)done
    broken = [f.name for f in sorted(folder.glob("*.safetensors")) if not _safetensors_whole(f)]
    problems = [f"{', '.join(broken)} cut short or not safetensors"] if broken else []
    if missing := model_folder_problem(folder):  # files deleted: it passed, the load failed
        problems.append(missing)
    if not problems:
        return
    after = (" (its GRPO checkpoints were trained on the old one: for a clean run, start a new "
             "output_dir)" if has_checkpoints else "")  # fmt: skip
    raise ConfigError(
        f"the SFT warm start {folder} is damaged ({'; '.join(problems)}); delete {folder} (its "
        f"{SFT_SUMMARY} with it) to redo the warm start when resuming{after}"
    )


def _refuse_other_tasks(path: Path, before: str | None, now: str | None) -> None:
    """Refuse to resume a run onto other tasks than it trained on, under the same config.

    The env's options can stay while its tasks change (a new version of the env, of its data,
    of a generated task list): resumed, the run would go on under the old indices on tasks it
    never saw, and evaluate on a different held-out set. A run recorded before digests were
    kept cannot be checked: a warning, since a training run is costly to start over.
    """
    if before == now or now is None:
        return
    if before is None:
        log.warning("%s does not record which tasks it trained on (written before agentgym "
                    "recorded them); resuming without checking them", path)  # fmt: skip
        return
    raise ConfigError(
        f"{path} trained on other tasks than the env has now (the env or its data changed "
        "since); restore them, or start a new output_dir"
    )


def _refuse_changed_config(
    path: Path, now: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> None:
    """Refuse to resume the run in ``path`` with a config that differs beyond the schedule.

    A knob the saved config lacks (the run was started by a version without it) is accepted
    at its value in ``defaults``: an upgrade must not strand every run made before it.
    """
    import yaml

    config_path = path / "config.yaml"
    if not config_path.is_file():
        return
    fix = "restore it, or delete it to resume under the config given now"
    try:
        saved = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        why = " ".join(str(exc).split())  # PyYAML's message spans lines: the CLI prints one
        raise ConfigError(f"cannot read the saved config {config_path} ({why}); {fix}") from exc
    if not isinstance(saved, dict):
        raise ConfigError(
            f"the saved config {config_path} holds a {type(saved).__name__}, not a mapping of "
            f"knobs; {fix}"
        )
    added = _normalise(defaults or {})
    may_change = _resumable_keys(now)
    differing = sorted(
        key
        for key in set(saved) | set(now)
        if key not in may_change
        and saved.get(key, added.get(key, _MISSING)) != now.get(key, _MISSING)
    )
    if differing:
        details = ", ".join(
            f"{k} (saved {saved.get(k, '<absent>')!r}, now {now.get(k, '<absent>')!r})"
            for k in differing
        )
        raise ConfigError(
            f"cannot resume {path}: the config differs from the saved one in {details}; "
            f"resume with the saved config ({config_path}) or choose a new output_dir. "
            f"Only {sorted(may_change)} may change on resume"
        )
    _refuse_rescheduled(path, saved.get("max_steps"), now)


def _resumable_keys(now: Mapping[str, Any]) -> frozenset[str]:
    """The keys a resume under config ``now`` may change.

    `RESUMABLE_KEYS`, and `PASS_KEYS` unless ``top_entropy_quantile`` < 1 makes the update
    depend on the passes (a change of the quantile itself is refused as any other knob's).
    """
    quantile = now.get("top_entropy_quantile", 1.0)
    per_pass = isinstance(quantile, (int, float)) and quantile < 1.0
    return RESUMABLE_KEYS if per_pass else RESUMABLE_KEYS | PASS_KEYS


def _refuse_rescheduled(path: Path, saved_max_steps: Any, now: Mapping[str, Any]) -> None:
    """Refuse a resume with a new ``max_steps`` when the learning rate is a function of it.

    Why: 'linear' and 'cosine' decay to 0 at ``max_steps`` and a fractional ``warmup_steps``
    is a share of it, so a resume with a larger one raised the rate of the steps after the
    checkpoint (1.67e-4 -> 2.5e-4): the run went on under another schedule, silently.
    """
    max_steps, schedule = now.get("max_steps"), now.get("lr_scheduler_type")
    warmup = now.get("warmup_steps") or 0
    if saved_max_steps is None or saved_max_steps == max_steps:
        return
    if schedule in ("linear", "cosine"):
        why = f"lr_scheduler_type {schedule!r} decays to 0 at max_steps"
    elif 0 < warmup < 1:
        why = f"warmup_steps {warmup} is a share of max_steps"
    else:
        return  # 'constant', or a warm-up of whole steps: the rate of a step stays
    raise ConfigError(
        f"cannot resume {path} with max_steps={max_steps} (saved {saved_max_steps}): "
        f"{why}, so the steps after the checkpoint would learn at other rates; keep "
        f"max_steps={saved_max_steps}, or train longer in a new output_dir (only a 'constant' "
        "or 'constant_with_warmup' schedule with whole warmup_steps may change max_steps)"
    )


def _describe_run(path: Path) -> str:
    """The saved run's state and last step, for a refusal (a dead ``running`` one: killed)."""
    try:
        status = _read_status(path)
    except ConfigError:
        return "its status.json cannot be read"
    state = status.get("state", "unknown state")
    if state == "running" and not _owner_alive(status):
        state = "killed"  # its process is gone: it was killed, not running
    step = status.get("step")
    return f"{state}, last step {step}" if step is not None else str(state)


def _owner_alive(status: Mapping[str, Any]) -> bool:
    """Whether the process ``status`` names still runs (assumed so on another host)."""
    pid = status.get("pid")
    if not isinstance(pid, int) or status.get("host") != socket.gethostname():
        return True
    return process_alive(pid)


def _refuse_fewer_steps(path: Path, max_steps: Any, status: Mapping[str, Any]) -> None:
    """Refuse a resume whose `max_steps` is below the step its checkpoint already reached.

    It used to train nothing, then label the final eval of the step-N model as step
    `max_steps` and report N GRPO steps as if the run had been asked for them. A finished run
    is refused alike (`finished_figures`): its figures are of step N, not of `max_steps`.
    """
    done = status.get("checkpoint_step")
    if not isinstance(max_steps, int) or not isinstance(done, int) or done <= max_steps:
        return
    # a finished run too: it said "max_steps 2 reached" and showed the figures of step 3
    where = ("it finished at step" if status.get("state") == "finished"
             else "its checkpoint is at step")  # fmt: skip
    raise ConfigError(
        f"cannot resume {path} with max_steps={max_steps}: {where} {done}; set max_steps to "
        f"{done} or more, or export that checkpoint as it is"
    )


def _refuse_live_owner(path: Path, status: Mapping[str, Any]) -> None:
    """Refuse a run another live process on this host is still writing."""
    pid = status.get("pid")
    if status.get("state") != "running" or not isinstance(pid, int) or pid == os.getpid():
        return
    if status.get("host") != socket.gethostname() or not _owner_alive(status):
        return
    raise ConfigError(
        f"{path} is being written by process {pid} on this host; stop it first (or, if that "
        "pid now belongs to something else, delete status.json) before resuming"
    )


def _attach_log_file(path: Path) -> logging.Handler:
    """Send INFO+ records of the ``agentgym`` logger to ``path`` while the run is open."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("agentgym")
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return handler


# ---- helpers: weights and RNG ----------------------------------------------------------------
