"""How a command stops on ``kill``: as on Ctrl-C, and with the exit code of the signal.

Why a module of its own: the CLI installs the handler, and the run index (`agentgym.runs`)
records the code a stopped command exits with; neither should import the other for it.
"""

from __future__ import annotations

import signal
from types import FrameType

#: The signal that stopped the command, where it was not Ctrl-C (`exit_on_sigterm`).
_stopped_by: list[signal.Signals] = []


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
        on_ctrl_c(signal.SIGINT, frame)

    signal.signal(signal.SIGTERM, on_sigterm)


def exit_code_after_stop(code: int) -> int:
    """``code``, or 143 where typer's code for a `KeyboardInterrupt` (130) came of a SIGTERM.

    Why: 128 + the signal is what a caller (a job queue, a shell) reads as "stopped by it".
    """
    return 128 + _stopped_by[0] if code == 128 + signal.SIGINT and _stopped_by else code
