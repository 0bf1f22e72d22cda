"""A clean-up that fails after a cancelled sandbox call is logged then, and the cancel stands.

Why: `in_thread_to_the_end` runs ``on_cancel`` / ``after_cancel`` (kill the call's code, close
what a cancelled start made) in a settle task of its own. Their error took the place of the
caller's cancel (a cancelled ``async with pool`` raised the close's error, not
``CancelledError``), and when the caller was cancelled again meanwhile (Ctrl-C twice, a
shutdown) the error was dropped without a word: a pool left up, and nothing said so.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from agentgym.sandboxes._protocol import in_thread_to_the_end


def close_that_fails() -> None:
    raise RuntimeError("the daemon refused to remove the container")


async def cancelled_call(cancels_until_done: bool) -> BaseException:
    """Cancel a call in its thread (once, or at every turn of the loop); what the caller got."""
    entered, release = threading.Event(), threading.Event()

    def start() -> None:
        entered.set()
        release.wait(30)

    call = asyncio.ensure_future(in_thread_to_the_end(start, after_cancel=close_that_fails))
    assert await asyncio.to_thread(entered.wait, 30)
    call.cancel()
    release.set()
    while cancels_until_done and not call.done():
        call.cancel()
        await asyncio.sleep(0)
    try:
        await call
    except BaseException as exc:  # noqa: BLE001 - what the caller sees is the finding
        return exc
    raise AssertionError("the cancelled call returned")


@pytest.mark.parametrize("cancels_until_done", [False, True], ids=["one cancel", "many"])
def test_a_failing_after_cancel_is_logged_and_the_caller_sees_its_cancel(
    caplog: pytest.LogCaptureFixture, cancels_until_done: bool
) -> None:
    with caplog.at_level(logging.ERROR, logger="agentgym.sandboxes._protocol"):
        raised = asyncio.run(cancelled_call(cancels_until_done))
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    failures = [r for r in caplog.records if r.name == "agentgym.sandboxes._protocol"]
    assert [r.getMessage() for r in failures] == [
        "cleaning up a cancelled sandbox call: after_cancel close_that_fails failed"
    ]
    assert failures[0].exc_info is not None
    assert "refused to remove" in str(failures[0].exc_info[1])
