"""A shorter busy-wait for vLLM's processes on the CPU build, so training gets the cores back.

Why: after each message, vLLM's engine core and worker keep polling their shared-memory queue
with ``sched_yield`` for a second (``SpinCondition.busy_loop_s`` in
``vllm/distributed/device_communicators/shm_broadcast.py``) before they sleep on a socket. A
trainer starts its optimiser step right after the rollouts, and on a machine with few cores
two spinning processes take its CPU: on two cores the train phase of
``bench/trainer_bench.py --skip-sync`` took 0.27-0.38 s with vLLM's spin and 0.18-0.22 s with
a 20 ms one. During rollouts engine steps follow each other within milliseconds, so the short
window keeps the readers spinning; one that does go to sleep is woken by the writer's
notification, vLLM's own idle path.

How: vLLM loads ``vllm.general_plugins`` entry points in each of its processes; `register`
(agentgym's entry point) sets the readers' window to ``AGENTGYM_VLLM_SPIN_S`` seconds where that
is in the environment. `enable_for_cpu_engines` sets it for engines started from this process
on the CPU build (unless already set; an empty value keeps vLLM's second). Windows under
`MIN_SPIN_SECONDS` are refused: the readers then sleep between decode steps, and waking a
sleeping process on a busy machine costs more than the spin saves (on two cores, 1 ms made
``bench/rollout_bench.py``'s multi-turn phase, run with that window, take 8.7 s instead of
4.6 s, and 0 made vLLM's worker exit mid-run: docs/engine.md). Written against vLLM 0.32;
where ``SpinCondition`` no longer has the window, `register` logs a warning.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

from .._errors import ConfigError

log = logging.getLogger(__name__)

#: Environment variable read in vLLM's processes: the readers' busy-wait window in seconds.
ENV_VAR = "AGENTGYM_VLLM_SPIN_S"
#: The window `enable_for_cpu_engines` asks for.
SPIN_SECONDS = 0.02
#: The shortest window accepted (5 ms measured as fast as 20 ms; 1 ms starved the engine).
MIN_SPIN_SECONDS = 0.005


def window_seconds(value: str) -> float | None:
    """The window ``value`` asks for, or None when it is not seconds >= `MIN_SPIN_SECONDS`."""
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= MIN_SPIN_SECONDS else None


def enable_for_cpu_engines() -> None:
    """Shorten the busy-wait of engines started from this process, on the CPU build only.

    Raises:
        ConfigError: the environment already asks for a window that is not seconds >=
            `MIN_SPIN_SECONDS` (checked here, before vLLM's processes would ignore it).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    value = os.environ.setdefault(ENV_VAR, str(SPIN_SECONDS))
    if value and window_seconds(value) is None:
        raise ConfigError(
            f"{ENV_VAR}={value!r} is not a busy-wait window vLLM can run with: give seconds "
            f">= {MIN_SPIN_SECONDS}, e.g. {SPIN_SECONDS}, or leave it empty for vLLM's 1 s"
        )


def register() -> None:
    """Give vLLM's queue readers the window the environment asks for (vLLM's plugin hook)."""
    value = os.environ.get(ENV_VAR)
    if not value:
        return
    seconds = window_seconds(value)
    if seconds is None:
        log.warning("%s=%r is not seconds >= %s; vLLM's busy-wait is unchanged",
                    ENV_VAR, value, MIN_SPIN_SECONDS)  # fmt: skip
        return
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:  # a vLLM without this queue: nothing spins the same way
        return
    if getattr(SpinCondition, "_agentgym_spin_s", None) is not None:
        return
    init = SpinCondition.__init__
    if "busy_loop_s" not in inspect.signature(init).parameters:
        log.warning("vLLM's SpinCondition changed; agentgym's shorter busy-wait is off")
        return

    def init_with_window(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if self.is_reader:
            self.busy_loop_s = seconds

    SpinCondition.__init__ = init_with_window  # type: ignore[method-assign]
    SpinCondition._agentgym_spin_s = seconds  # type: ignore[attr-defined]
