"""`kill -9` of a training run once it has checkpointed a step: what the resume tests start from."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def kill_at_checkpoint(proc: subprocess.Popen[bytes], run: Path, step: int, timeout: float) -> Path:
    """Wait until ``run`` holds the checkpoint of ``step``, then SIGKILL ``proc``'s group.

    ``proc`` must have started in a session of its own (``start_new_session=True``), so the
    engine's workers die with it. Returns the newest checkpoint folder the killed run left.
    """
    try:
        deadline = time.monotonic() + timeout
        while not (run / "checkpoints" / f"step-{step:06d}" / "trainer_state.json").exists():
            assert proc.poll() is None, f"the run ended before its checkpoint of step {step}"
            assert time.monotonic() < deadline, f"no checkpoint of step {step} in {timeout:g} s"
            time.sleep(0.2)  # polling an observable file, not sleeping in place of a sync
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return max((run / "checkpoints").glob("step-*"))
