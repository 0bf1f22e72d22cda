"""An eval's ``--out`` folder: what an earlier run left there, one writer at a time, whole files.

Why a module of its own: ``agentgym eval --resume`` promises that a killed run loses nothing it
wrote and plays each missing episode exactly once; these are the pieces that keep it
(`tests/test_eval_resume_kill.py` kills real runs at each moment).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._durable import atomic_write_text
from ._errors import ConfigError
from ._trajectory import Trajectory, TrajectoryLineError, recover_jsonl, write_jsonl


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``path`` whole or not at all (`atomic_write_text`): a kill leaves no half file."""
    atomic_write_text(path, json.dumps(data, indent=2))


class FolderLock:
    """An exclusive lock on an eval's ``--out`` folder, held while the run writes to it.

    Two writers of one folder (a ``--resume`` while the first run still plays, a retry of a
    run thought dead) would each play the missing episodes and append them: every one twice.
    The lock is `fcntl.flock` on the folder itself (no extra file in it); the kernel drops it
    when the process ends, even by ``kill -9``, so a killed run never leaves a stale lock. A
    forked child (vLLM forks its engine process on a GPU) closes its copy of the descriptor
    at once (`_HELD`): a lock shares the open file, and an orphaned engine holding it would
    refuse every ``--resume``. A filesystem that cannot lock (some NFS mounts) is warned
    about, never fatal.
    """

    def __init__(self, out: Path, warn: Callable[[str], None]) -> None:
        self.out = out
        self.warn = warn
        self.fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock if ``out`` exists and it is not held yet; True if taken now."""
        if self.fd is not None or not self.out.is_dir():
            return False
        fd = os.open(self.out, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"another agentgym eval is writing to {self.out}; wait for it to end (or stop "
                "it), then rerun with --resume, or choose another --out"
            ) from None
        except OSError as exc:
            os.close(fd)
            self.warn(f"warning: cannot lock {self.out} ({exc}); run one eval in it at a time")
            return False
        self.fd = fd
        _HELD.add(fd)
        return True

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            _HELD.discard(self.fd)
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


#: Descriptors of the locks this process holds, which a forked child must not keep.
_HELD: set[int] = set()


def _close_held_in_child() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


def finished_summary(out: Path, done: int, planned: int) -> dict[str, Any] | None:
    """The saved summary of a run whose ``planned`` episodes are all ``done``, else None.

    Resuming a finished run then plays nothing and rewrites nothing: its summary (timings
    included) stays the one the run wrote. A summary that is missing, unreadable or counts
    other episodes (the run was killed before writing it) is written again by playing none.
    """
    path = out / "summary.json"
    if done < planned or not path.exists():
        return None
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(summary, dict) or summary.get("episodes") != done:
        return None
    return summary


def previous_episodes(out: Path, run_config: dict[str, Any], resume: bool) -> list[Trajectory]:
    """Episodes an earlier run in ``out`` finished; refuses to mix runs of other settings."""
    results = out / "trajectories.jsonl"
    if not results.exists():
        return []
    if not resume:
        raise ConfigError(
            f"{results} exists; pass --resume to continue that run, or choose another --out"
        )
    saved_path = out / "run.json"
    saved = json.loads(saved_path.read_text()) if saved_path.exists() else {}
    differ = sorted(k for k in run_config if k != TASKS_KEY and saved.get(k) != run_config[k]
                    and (k in saved or k not in RECORDED_LATER))  # fmt: skip
    if differ:
        changes = "; ".join(
            f"{k} {json.dumps(saved.get(k))} there, {json.dumps(run_config[k])} now" for k in differ
        )
        raise ConfigError(
            f"--resume: settings differ from {saved_path} ({changes}); "
            "rerun with its settings or choose another --out"
        )
    _refuse_other_tasks(saved_path, saved.get(TASKS_KEY), run_config.get(TASKS_KEY))
    episodes = _recovered_episodes(results)
    kept = [t for t in episodes if t.status not in ("infra_error", "late")]
    if len(kept) < len(episodes):  # the machinery or the clock cut them: play them again
        write_jsonl(kept, results)
    return kept


#: Keys ``run.json`` gained after runs were written without them: a run saved before then
#: still resumes (its folder cannot say which server it used).
RECORDED_LATER = frozenset({"base_url", "server", "router_url"})

#: The key of ``run.json`` holding `agentgym._tasks.tasks_digest` of the tasks played.
TASKS_KEY = "tasks_sha256"


def _refuse_other_tasks(saved_path: Path, saved: str | None, now: str | None) -> None:
    """Refuse a resume whose tasks are not the ones the run in the folder played.

    The env's options can be the same while its tasks are not (a new version of the env or of
    its data); resumed, the run would add episodes of other tasks under the same indices. A
    ``run.json`` from before digests were recorded cannot be checked, so it is refused too: an
    eval is cheap to run again, a figure that mixes two task lists is not to be trusted.
    """
    if saved == now:
        return
    why = (
        "does not record which tasks it played (written before agentgym recorded them)"
        if saved is None
        else "played other tasks than the env has now (the env or its data changed since)"
    )
    raise ConfigError(
        f"--resume: the run of {saved_path} {why}; choose another --out to evaluate again"
    )


def _recovered_episodes(results: Path) -> list[Trajectory]:
    """`recover_jsonl` (a torn last line is cut off), with a bad line refused by its number.

    A line that is not a trajectory before the last one is no kill's doing (a lost disk
    block, a hand edit): guessing would drop or replay episodes silently, so the user is told
    which line to look at, in one line instead of a JSON traceback.
    """
    try:
        return recover_jsonl(results)
    except TrajectoryLineError as exc:
        raise ConfigError(
            f"--resume: {exc}; fix or delete that line (its episode is then played again) "
            "and rerun with --resume"
        ) from None
