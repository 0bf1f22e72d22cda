"""`track_run`: the hook that indexes an ``agentgym train``/``eval``/``sft`` process.

Indexing must never cost a run: a database that cannot be opened or written is a warning on
the ``agentgym.runs`` logger and the run goes on unindexed. ``AGENTGYM_RUNS_DB=off`` turns
indexing off. A process started by a job queue finds its row through ``AGENTGYM_RUN_ID`` and
adopts it instead of adding a second one.

Exit codes (what a queue reads to decide on a retry):

- 0 finished; 2 (`EXIT_CONFIG`) a bad config, never retried;
- 75 (`EXIT_INFRA`, BSD's EX_TEMPFAIL) an `InfraError` (a server or sandbox that failed):
  the machinery, not the config, so a retry may succeed;
- a kill signal (negative code, or 128 + signal from a handler) is also infrastructure;
- 1 anything else (a crash in our code): failed, not retried.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from agentgym._errors import ConfigError, InfraError
from agentgym._pid import process_alive
from agentgym._stop import exit_code_after_stop

from ._folder import read_figures, read_step
from ._store import DISABLED, RunStatus, RunStore, now_iso

log = logging.getLogger("agentgym.runs")

EXIT_CONFIG = 2
EXIT_INFRA = 75
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL, signal.SIGHUP)


def exit_code_of(exc: BaseException | None) -> int:
    """The exit code ``agentgym`` ends with when ``exc`` escapes a command."""
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or `kill` (`exit_on_sigterm`)
        return exit_code_after_stop(128 + signal.SIGINT)
    if isinstance(exc, ConfigError):
        return EXIT_CONFIG
    if isinstance(exc, InfraError):
        return EXIT_INFRA
    return 1


def is_signal_exit(code: int) -> bool:
    """Whether ``code`` says the process was stopped by a signal (-N or 128 + N)."""
    return code < 0 or code - 128 in _STOP_SIGNALS


def is_infra_failure(code: int) -> bool:
    """Whether a run that ended with ``code`` failed for a reason a retry may fix."""
    return code == EXIT_INFRA or is_signal_exit(code)


def status_of(code: int) -> RunStatus:
    """The status a process's own exit code gives its run."""
    if code == 0:
        return RunStatus.finished
    return RunStatus.interrupted if is_signal_exit(code) else RunStatus.failed


@contextlib.contextmanager
def track_run(
    kind: str, name: str, config: Mapping[str, Any], run_dir: str | os.PathLike[str]
) -> Iterator[str | None]:
    """Index the run done inside the block; yields its run id (None when not indexed).

    An `InfraError` escaping the block leaves as ``SystemExit(EXIT_INFRA)`` after its
    message is logged, so a queue can tell it from a crash.
    """
    tracker = _Tracker.start(kind, name, config, Path(run_dir))
    try:
        yield tracker.run_id
    except BaseException as exc:
        tracker.finish(exit_code_of(exc), exc)
        if isinstance(exc, InfraError):
            log.error("infrastructure error: %s", exc)
            raise SystemExit(EXIT_INFRA) from exc
        raise
    tracker.finish(0, None)


def _folder_state(run_dir: Path) -> frozenset[tuple[str, int, int]]:
    """(name, mtime, size) of what lies at the top of ``run_dir``: what a run there writes."""
    try:
        return frozenset((e.name, (st := e.stat()).st_mtime_ns, st.st_size)
                         for e in os.scandir(run_dir))  # fmt: skip
    except OSError:
        return frozenset()


class _Tracker:
    """The row of one CLI process; every database call is guarded (see module docstring).

    A process that failed having written nothing in its folder records no figures or step
    from it: they are another run's (a refused rerun into a finished run's folder was listed
    as failed "at step 3", the step of the run it was refused for). Changes a live run of the
    same folder made meanwhile are not its own (a ``--resume`` refused for a folder being
    written was listed as failed at the writer's step).

    A process that did nothing in a folder another row indexes, refused (exit 2) or with
    nothing left to do (a resume of a finished run, exit 0), leaves no row: it was listed
    next to, and ``runs show FOLDER`` took it over, the run that wrote the folder. A queued
    job's row (``AGENTGYM_RUN_ID``) is its queue's and always kept.
    """

    def __init__(
        self, store: RunStore | None, run_id: str | None, run_dir: Path, *, adopted: bool = False
    ) -> None:
        self.store, self.run_id, self.run_dir = store, run_id, run_dir
        self.adopted = adopted
        self.found = _folder_state(run_dir)

    @classmethod
    def start(cls, kind: str, name: str, config: Mapping[str, Any], run_dir: Path) -> _Tracker:
        if os.environ.get("AGENTGYM_RUNS_DB", "").lower() == DISABLED:
            return cls(None, None, run_dir)
        try:
            store = RunStore()
            running: dict[str, Any] = {
                "status": RunStatus.running, "pid": os.getpid(), "host": socket.gethostname(),
                "started_at": now_iso(), "ended_at": None, "run_dir": str(run_dir.resolve()),
            }  # fmt: skip
            run_id = os.environ.get("AGENTGYM_RUN_ID")
            if run_id and store.update_run(run_id, config=dict(config), **running):
                return cls(store, run_id, run_dir, adopted=True)
            run_id = store.create_run(kind=kind, name=name, config=config, source="cli", **running)
            return cls(store, run_id, run_dir)
        except Exception as exc:  # indexing must never stop a run
            log.warning("run not indexed in the run store (%s); the run goes on", exc)
            return cls(None, None, run_dir)

    def finish(self, code: int, exc: BaseException | None) -> None:
        if self.store is None or self.run_id is None:
            return
        mine = {"status": "running", "pid": os.getpid()}  # the row as this process left it
        try:
            wrote = _folder_state(self.run_dir) != self.found and not self._another_writer()
            if not wrote and code in (0, EXIT_CONFIG) and self._indexed_elsewhere():
                self.store.delete_run(self.run_id, only_if=mine)
                return
            own = code == 0 or wrote  # the folder's figures
            values: dict[str, Any] = {
                "status": status_of(code), "exit_code": code, "ended_at": now_iso(),
                "figures": read_figures(self.run_dir) if own else {},
                "step": read_step(self.run_dir) if own else None,
            }  # fmt: skip
            if exc is not None and code != 0:
                values["error_tail"] = _error_text(exc)
            self.store.update_run(self.run_id, only_if=mine, **values)
        except Exception as db_exc:  # a warning, never a failed run
            log.warning("run %s: could not record its end (%s)", self.run_id, db_exc)
        finally:
            self.store.close()

    def _others(self) -> list[dict[str, Any]]:
        """The other rows that name this run's folder."""
        assert self.store is not None  # only called with a store; narrows the type
        rows = self.store.list_runs(limit=None, run_dir=str(self.run_dir.resolve()))
        return [row for row in rows if row["id"] != self.run_id]

    def _another_writer(self) -> bool:
        """Whether a live process of another row is running in this run's folder."""
        host = socket.gethostname()
        return any(row["status"] == RunStatus.running
                   and (row["host"] != host or process_alive(row["pid"]))
                   for row in self._others())  # fmt: skip

    def _indexed_elsewhere(self) -> bool:
        """Whether this row may go: this process made it, and another row names the folder.

        Why the other row: the folder stays found (a first run of a copied folder keeps its row).
        """
        return not self.adopted and bool(self._others())


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ConfigError | InfraError | SystemExit | KeyboardInterrupt):
        return f"{type(exc).__name__}: {exc}"
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:]).rstrip()
