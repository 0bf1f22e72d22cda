"""vLLM's engine core forks its worker on the CPU build instead of spawning it.

Why: vLLM-CPU makes its worker with ``spawn`` (``vllm/platforms/cpu.py`` sets
``VLLM_WORKER_MULTIPROC_METHOD``), so the worker starts a fresh interpreter and imports torch
and vLLM again, about 10 s of CPU on the 2-core machines this was measured on, at every engine
start, while the engine core that makes it has them loaded already. On GPUs vLLM itself forks
its workers from the engine core (its default), so the engine core's state is one vLLM forks
from. `bench/engine_lifecycle_bench.py`: ``start()`` 15.4-15.9 s against 24.6-24.9 s with a
spawned worker (two runs, medians of 3 alternating trials, an idle 2-core machine, 2026-12-07),
the same batch speed, 224 MB less memory (pages shared with the engine core).

What the spawned worker got that a forked one must be given: vLLM puts the worker's CPU
placement in its environment (``GOMP_CPU_AFFINITY`` for the torch OpenMP it preloads, or
``OMP_PLACES`` / ``KMP_AFFINITY``; ``OMP_NUM_THREADS``) just before starting it, and a spawned
interpreter's OpenMP reads them at start; in a fork OpenMP was set up long before, so
`_PlacedForkProcess` applies them (the CPU affinity and torch's thread count) first. And vLLM
loads its plugins in a spawned worker after it set the worker's signal handlers (agentgym's
`_orphan_guard` ignores Ctrl-C there); a fork inherits "plugins loaded", so the worker is told
to load them again (each agentgym plugin does its work once per process; `_orphan_guard`
forgets its watch in a forked child, whose parent is new and whose threads are gone).

Why a fork is safe there: the engine core makes its worker first thing (`EngineCore.__init__`
creates the executor right after loading plugins), having unpickled the config and run no
parallel torch op, so the worker inherits no OpenMP thread pool. That matters: a child forked
after its parent ran one parallel op (a 2000 x 2000 matmul, GNU OpenMP as vLLM preloads it)
hung at its own first one, here. It is also why the process that creates the engine (a
trainer, say) is never forked from.

How: vLLM loads ``vllm.general_plugins`` entry points in each of its processes, the engine core
before it makes its worker. `register` (agentgym's entry point), in a vLLM process below one
that started it (`_orphan_guard.ENV_VAR`) on the CPU build, makes vLLM's executor use
`_PlacedForkContext`. Left to vLLM: the process that creates the engine, and any engine core
with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (vLLM then runs it inside that process, which may
hold anything: no fork), a process whose ``LD_PRELOAD`` changed since it started (the fork
would lack what a spawned worker preloads), and ``AGENTGYM_VLLM_WORKER_START=spawn``. vLLM's
``numa_bind`` option, which starts a spawned worker through ``numactl``, needs
``AGENTGYM_VLLM_WORKER_START=spawn`` too. Written against vLLM 0.32; where the executor no
longer asks ``get_mp_context`` (or is gone), `register` logs a warning.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.context
import os
import re
from collections.abc import Mapping
from typing import Any

from .._errors import ConfigError
from . import _orphan_guard

log = logging.getLogger(__name__)

#: Environment variable: ``spawn`` leaves the start of the worker, and of a process's later
#: engine cores (`_core_forkserver`), to vLLM (default: fork them).
ENV_VAR = "AGENTGYM_VLLM_WORKER_START"


def fork_wanted(environ: Mapping[str, str], pid: int, started_with: Mapping[str, str]) -> bool:
    """Whether the vLLM process ``pid`` should fork its worker.

    ``environ`` is its environment now, ``started_with`` the one it was started with: a fork
    keeps the libraries the process loaded, so ``LD_PRELOAD`` (where vLLM puts torch's OpenMP
    for its spawned processes) must not have changed since.
    """
    owner = environ.get(_orphan_guard.ENV_VAR, "")
    return (
        owner.isdigit()
        and int(owner) != pid  # the owner itself: whatever it holds, no fork
        and environ.get(ENV_VAR, "fork") != "spawn"
        and environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0"  # else the engine core is the
        # caller's process (a server's API process, say), which may have used OpenMP
        and environ.get("LD_PRELOAD", "") == started_with.get("LD_PRELOAD", "")
    )


def check_setting(environ: Mapping[str, str] = os.environ) -> None:
    """Refuse an `ENV_VAR` that is neither ``fork`` nor ``spawn``, before an engine starts.

    Raises:
        ConfigError: the value is something else (vLLM's processes would fork regardless).
    """
    value = environ.get(ENV_VAR, "fork")
    if value not in ("fork", "spawn"):
        raise ConfigError(
            f"{ENV_VAR}={value!r} is not how vLLM's processes can start: give 'fork' "
            "(agentgym's default on the CPU build) or 'spawn' (vLLM's own start)"
        )


def _environment_at_start() -> dict[str, str]:
    """The environment this process was started with (Linux keeps that block)."""
    with open("/proc/self/environ", "rb") as block:
        entries = block.read().split(b"\0")
    return dict(entry.decode(errors="replace").partition("=")[::2] for entry in entries if entry)


def register() -> None:
    """Make this engine core fork its worker where `fork_wanted` (vLLM's plugin hook)."""
    if not fork_wanted(os.environ, os.getpid(), _environment_at_start()):
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return  # vLLM's own choice (fork unless CUDA is initialised)
    executor: Any = None
    with contextlib.suppress(ImportError):  # raised here, it would stop the engine core
        import vllm.v1.executor.multiproc_executor as executor
    if not callable(getattr(executor, "get_mp_context", None)):
        log.warning("vLLM's executor changed; its worker is spawned (a slower engine start)")
        return
    setattr(executor, "get_mp_context", _placed_fork_context)  # noqa: B010 (a module: mypy)


def _placed_fork_context() -> multiprocessing.context.BaseContext:
    from vllm.utils.system_utils import get_mp_context

    get_mp_context()  # vLLM's side effects (its checks, the environment it syncs)
    return _PlacedForkContext()


def worker_placement(environ: Mapping[str, str]) -> tuple[set[int] | None, int | None]:
    """The CPUs and the thread count vLLM put in ``environ`` for a spawned worker.

    vLLM writes them for the OpenMP it finds in ``LD_PRELOAD`` (Intel's, GNU's, or else the
    standard variables); None where it wrote none.
    """
    preload = environ.get("LD_PRELOAD", "")
    if "libiomp" in preload or "libomp" in preload:
        found = re.search(r"proclist=\[([\d,]+)\]", environ.get("KMP_AFFINITY", ""))
        cpus = found.group(1).split(",") if found else []
    elif "libgomp" in preload:
        cpus = environ.get("GOMP_CPU_AFFINITY", "").split()  # "0 1 2"
    else:
        cpus = environ.get("OMP_PLACES", "").strip("{}").split(",")  # "{0,1,2}"
    threads = environ.get("OMP_NUM_THREADS", "")
    return ({int(cpu) for cpu in cpus if cpu.isdigit()} or None,
            int(threads) if threads.isdigit() else None)  # fmt: skip


def _take_placement_from_environment() -> None:
    import torch

    cpus, threads = worker_placement(os.environ)
    if cpus:
        os.sched_setaffinity(0, cpus)
    if threads:
        torch.set_num_threads(threads)


class _PlacedForkProcess(multiprocessing.context.ForkProcess):
    """A forked process that starts as vLLM's spawned worker would: placed, plugins to load."""

    def run(self) -> None:
        import vllm.plugins

        _take_placement_from_environment()
        vllm.plugins.plugins_loaded = False  # loaded again after the worker's signal handlers
        super().run()


class _PlacedForkContext(multiprocessing.context.ForkContext):
    Process = _PlacedForkProcess
