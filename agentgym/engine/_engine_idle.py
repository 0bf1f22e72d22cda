"""An idle switch for vLLM's engine processes: stop busy-waiting when no turn is coming.

After each batch, vLLM's processes keep polling their message queue with ``sched_yield`` for a
second (``SpinCondition`` in ``vllm/distributed/device_communicators/shm_broadcast.py``)
before they sleep on a socket. On a 2-core machine that spin takes a core from whatever runs
next, and in a trainer an optimiser step runs right after every rollout: torch work started
right after a generate ran 1.5-2x slower than two seconds later (``bench/engine_idle_bench.py``).

The switch is one byte in a small file whose path the engine's processes inherit in their
environment (`ENV_VAR`); `register`, vLLM's plugin hook, makes their queue readers check it:
1 tells every reader to skip the spin and sleep on its socket at once (a new request wakes
it, as after any idle second); 0 restores vLLM's behaviour. `VLLMPolicy.idle` sets it; the
policy's next turn clears it before the request is sent.
"""

from __future__ import annotations

import logging
import mmap
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
#: The switch file's path, as the engine's processes see it.
ENV_VAR = "AGENTGYM_ENGINE_IDLE_FILE"


class IdleSwitch:
    """The caller's side: a one-byte file in memory-backed storage, flipped by `set`."""

    def __init__(self) -> None:
        shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
        fd, self.path = tempfile.mkstemp(prefix="agentgym-idle-", dir=shm)
        os.write(fd, b"\0")
        self._file = os.fdopen(fd, "r+b", buffering=0)
        self.idle = False

    def set(self, idle: bool) -> None:
        """Tell the engine's processes whether a turn may come soon (False) or not (True)."""
        if idle != self.idle:
            self._file.seek(0)
            self._file.write(b"\1" if idle else b"\0")
            self.idle = idle

    def close(self) -> None:
        """Remove the file (the engine's processes are gone by then)."""
        self._file.close()
        Path(self.path).unlink(missing_ok=True)


def register() -> None:
    """Make vLLM's queue readers honour the switch their process inherited (plugin hook).

    Patched in every process that loads vLLM's plugins, switch or not: a process forked from
    one that already loaded them does not load them again. Each reader looks its switch up in
    its own environment, so an engine started after another one follows its own.
    """
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:  # a vLLM without this queue: nothing spins the same way
        return
    if getattr(SpinCondition, "_agentgym_idle_switch", False):
        return
    if not callable(getattr(SpinCondition, "wait", None)):
        log.warning("vLLM's SpinCondition changed; agentgym's idle switch is off")
        return
    wait = SpinCondition.wait

    def wait_or_sleep(self: Any, timeout_ms: int | None = None) -> None:
        if getattr(self, "is_reader", False) and _idle():
            self.last_read = float("-inf")  # past the busy window: sleep on the socket now
        wait(self, timeout_ms)

    SpinCondition.wait = wait_or_sleep  # type: ignore[method-assign]
    SpinCondition._agentgym_idle_switch = True  # type: ignore[attr-defined]


#: Switch files mapped by this process, by path (None: the file could not be opened).
_switches: dict[str, mmap.mmap | None] = {}


def _idle() -> bool:
    """Whether the switch this process inherited says idle (False without one)."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return False
    if path not in _switches:
        try:
            with open(path, "rb") as file:
                _switches[path] = mmap.mmap(file.fileno(), 1, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # gone already: vLLM's own behaviour
            _switches[path] = None
    switch = _switches[path]
    return switch is not None and switch[0] == 1
