"""`kill -9` of a training run at a moment a test picks: what the resume tests start from."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def kill_when(
    proc: subprocess.Popen[bytes], ready: Callable[[], bool], what: str, timeout: float
) -> None:
    """SIGKILL ``proc``'s group as soon as ``ready()`` holds (polled every few ms).

    ``proc`` must have started in a session of its own (``start_new_session=True``), so the
    engine's workers die with it. ``what`` names the moment in the failure messages. The group
    is killed whatever happens, so a failed wait leaves no run behind.
    """
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, f"the run ended before {what}"
            assert time.monotonic() < deadline, f"no {what} in {timeout:g} s"
            time.sleep(0.005)  # polling an observable file, not sleeping in place of a sync
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def kill_at_checkpoint(proc: subprocess.Popen[bytes], run: Path, step: int, timeout: float) -> Path:
    """Wait until ``run`` holds the checkpoint of ``step``, then SIGKILL ``proc``'s group.

    Returns the newest checkpoint folder the killed run left.
    """
    state = run / "checkpoints" / f"step-{step:06d}" / "trainer_state.json"
    kill_when(proc, state.exists, f"the checkpoint of step {step}", timeout)
    return max((run / "checkpoints").glob("step-*"))


def die_at_writes_past(limit: int) -> None:
    """Make this process die by a signal at its first write that takes a file past ``limit`` bytes.

    Why: a `kill -9` lands between two writes, or in the middle of one; this puts it in the
    middle of the next large write, every time (`RLIMIT_FSIZE`, whose SIGXFSZ Python ignores
    unless told not to), where a polling killer catches that moment only by luck. Call it in a
    child process, right before the write.
    """
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
