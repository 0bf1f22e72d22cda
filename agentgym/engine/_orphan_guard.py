"""vLLM's processes end with the process that started them, even one killed with ``kill -9``.

Why: a trainer or eval killed with SIGKILL cannot shut its engine down, and vLLM's engine core
and workers then live on under init, idle, holding their memory (2.5 GB on the CPU build for
the quickstart's tiny model; on a GPU its memory, so the ``--resume`` that follows may not fit).
Measured: every ``kill -9`` of ``agentgym train`` while its engine was up left them running.

How: vLLM loads ``vllm.general_plugins`` entry points in each of its processes; `register`
(agentgym's entry point) starts, in each vLLM process below a process that set `ENV_VAR` to its
own pid (`guard_engines_of_this_process`: `VLLMPolicy` and the local server launcher do), a
daemon thread that checks once a second whether the process's parent is still the one that
started it, and kills the process when it is not: an orphan has been adopted by init or a
subreaper. The engine core's workers are its children, so they follow it (a worker the engine
core forked, `_fork_worker`, starts its own watch when vLLM loads its plugins in it). The
process that set the variable is left alone, and so is every process where it is not set.

Each such process also ignores SIGINT: a terminal's Ctrl-C reaches the whole process group, and
vLLM's worker, exiting on it mid-step, made its engine core print some 40 ERROR lines and a
traceback ("Worker proc died unexpectedly") over the command's own "interrupted" line. The
owner takes the Ctrl-C and closes its engine (SIGTERM, still vLLM's own orderly stop).

Each such process also skips Python's last garbage collection at exit (`agentgym._quick_exit`):
a vLLM worker spent about 3 s there, and vLLM kills an engine core that is not gone 5 s after
``close()`` asks it to stop, so every close took 5 s.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from .._quick_exit import skip_final_collection

#: Environment variable: the pid of the process whose vLLM processes must not outlive it.
ENV_VAR = "AGENTGYM_ENGINE_OWNER"
#: Seconds between two looks at the parent.
POLL_SECONDS = 1.0
_started = False


def guard_engines_of_this_process(environ: dict[str, str] | None = None) -> None:
    """Make the vLLM processes started from here (or with ``environ``) end with this one."""
    (os.environ if environ is None else environ)[ENV_VAR] = str(os.getpid())


def register() -> None:
    """Start the parent watch in a vLLM process started by agentgym (vLLM's plugin hook)."""
    global _started
    owner = os.environ.get(ENV_VAR, "")
    if _started or not owner.isdigit() or int(owner) == os.getpid():
        return  # once; not ours; or the owner itself (vLLM loads plugins in the caller too)
    _started = True
    os.register_at_fork(after_in_child=_forget_watch)
    skip_final_collection()
    if threading.current_thread() is threading.main_thread():  # where vLLM set its handlers
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner's Ctrl-C: it stops them
    parent = os.getppid()
    threading.Thread(target=_watch, args=(parent,), name="agentgym-orphan-guard",
                     daemon=True).start()  # fmt: skip


def _forget_watch() -> None:
    """In a forked child (`_fork_worker`'s worker): the watch thread stayed in the parent.

    The child's own plugin load (vLLM's worker loads them) then starts a watch on its parent.
    """
    global _started
    _started = False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup to run: the owner is gone
