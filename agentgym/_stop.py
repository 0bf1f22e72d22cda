"""How a command stops on ``kill``: as on Ctrl-C, and with the exit code of the signal.

Why a module of its own: the CLI installs the handler, and the run index (`agentgym.runs`)
records the code a stopped command exits with; neither should import the other for it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from types import FrameType

#: The signal that stopped the command, where it was not Ctrl-C (`exit_on_sigterm`).
_stopped_by: list[signal.Signals] = []

#: Seconds a SIGTERM gives the event loop to take its stop before the command stops as on a
#: second signal (`_insist_unless_taken`): a job queue sends SIGKILL some seconds after one
#: SIGTERM (``docker stop``: 10 s), and a stopping run still needs time to close its envs.
SIGTERM_GRACE_S = 3.0


def exit_on_sigterm() -> None:
    """Make ``kill PID`` stop the command as Ctrl-C does, and exit 143 (128 + SIGTERM).

    Why: Python's default SIGTERM (``kill``, ``docker stop``, a job queue's cancel) ends the
    process on the spot, and what it started in sessions of its own, which the signal never
    reaches, outlived it: vLLM engine processes, sandbox containers, MCP servers busy in a
    call and their workspace copies. Not `sys.exit` from the handler: a `SystemExit` raised
    wherever the signal lands is a tool's own failure to the code it lands in (an eval went
    on, and hung). The Ctrl-C path instead is the one every layer is built and tested for:
    inside `asyncio.run` the first one cancels the main task, so envs close.
    """

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        _stopped_by[:] = [signal.SIGTERM]
        on_ctrl_c = signal.getsignal(signal.SIGINT)
        if not callable(on_ctrl_c):  # SIGINT ignored (started with `&` by a script): still stop
            raise KeyboardInterrupt
        loop = running_loop()
        on_ctrl_c(signal.SIGINT, frame)  # asyncio's: cancels the main task; a second one raises
        if loop is not None:
            _insist_unless_taken(loop)

    signal.signal(signal.SIGTERM, on_sigterm)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, if any.

    Why a function: code that checks must not go on inside the ``except`` that catches
    `asyncio.get_running_loop`'s RuntimeError, or every traceback raised after it would begin
    with that error ("During handling of the above exception ...").
    """
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _insist_unless_taken(loop: asyncio.AbstractEventLoop) -> None:
    """Send SIGTERM again in `SIGTERM_GRACE_S` unless ``loop`` turns before then.

    Why: the first Ctrl-C only cancels the main task, which happens when the loop next turns;
    a sync tool or reward function that never returns holds the loop, and the one SIGTERM a
    job queue sends did nothing (its SIGKILL then left vLLM's and the sandboxes' processes
    behind). The second signal raises KeyboardInterrupt wherever the main thread is, even in
    a blocking call. Why only when the loop did not turn: a loop that turns has taken the
    cancellation, and its stop is the clean one, closing envs; a KeyboardInterrupt raised
    into that cleanup would cut it short.
    """
    taken = threading.Event()
    loop.call_soon_threadsafe(taken.set)
    main = threading.main_thread().ident

    def insist() -> None:
        if not taken.wait(SIGTERM_GRACE_S) and main is not None:
            signal.pthread_kill(main, signal.SIGTERM)  # a real signal: wakes a blocking call

    threading.Thread(target=insist, name="sigterm-grace", daemon=True).start()


def exit_code_after_stop(code: int) -> int:
    """``code``, or 143 where typer's code for a `KeyboardInterrupt` (130) came of a SIGTERM.

    Why: 128 + the signal is what a caller (a job queue, a shell) reads as "stopped by it".
    """
    return 128 + _stopped_by[0] if code == 128 + signal.SIGINT and _stopped_by else code
