"""What a tool or reward function raises that is not an `Exception` fails the call, not the run.

Before: argparse's `SystemExit` on arguments it refuses (a model's arguments can make a tool
exit) ended the whole rollout and lost every episode in it; `StopIteration` (``next`` on an
iterator with nothing left) could not be delivered from a worker thread, so a sync tool's
caller waited out its 30 s timeout and a threaded reward function's forever; a tool's own
`CancelledError` read as the episode's cancellation. A real cancellation and Ctrl-C on the
event loop still end what they end.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
from collections.abc import Callable

import pytest

from agentgym import Rubric, ScriptedPolicy, ToolEnv, arollout, rollout, tool

DEADLINE_S = 20.0  # every call here ends at once; a call that never settles makes it 'late'
TASKS = [{"prompt": f"task {i}", "answer": str(i)} for i in range(8)]


def stop_iteration() -> BaseException:
    try:
        next(iter([]))
    except StopIteration as exc:
        return exc
    raise AssertionError("unreachable")


RAISED: dict[str, Callable[[], BaseException]] = {
    "SystemExit": lambda: SystemExit(2),
    "GeneratorExit": GeneratorExit,
    "CancelledError": asyncio.CancelledError,  # its own: nobody cancelled the episode
    "StopIteration": stop_iteration,
}


def failing_tool(make_error: Callable[[], BaseException], is_async: bool) -> object:
    if is_async:

        async def boom(x: int) -> str:
            """Fail.

            Args:
                x: anything.
            """
            raise make_error()

        return tool(boom)

    def boom_sync(x: int) -> str:
        """Fail.

        Args:
            x: anything.
        """
        raise make_error()

    return tool(name="boom")(boom_sync)


CALL = '<tool_call>{"name": "boom", "arguments": {"x": 1}}</tool_call>'


# Python turns StopIteration in a coroutine into RuntimeError itself (PEP 479)
TOOL_CASES = [
    (k, a) for k in sorted(RAISED) for a in (True, False) if (k, a) != ("StopIteration", True)
]


@pytest.mark.parametrize(("kind", "is_async"), TOOL_CASES)
def test_a_tool_raising_it_is_a_tool_error_the_model_reads(kind: str, is_async: bool) -> None:
    boom = failing_tool(RAISED[kind], is_async)

    def make() -> ToolEnv:
        return ToolEnv(
            [boom], tasks=TASKS[:1], rubric=Rubric([lambda completion: 1.0], names=["one"])
        )

    [episode] = rollout(make, ScriptedPolicy([CALL, "done"]), deadline=DEADLINE_S)
    assert episode.status == "ok", episode.error
    [result] = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert result.startswith(f"Error: 'boom' raised {kind}"), result
    assert episode.turns[0].tool_errors == [result.removeprefix("Error: ")]


def test_argparse_exiting_on_a_models_arguments_loses_no_episode() -> None:
    """A tool wrapping a CLI: one episode of eight sends an option it does not know."""
    parser = argparse.ArgumentParser(prog="grep", exit_on_error=False)
    parser.add_argument("pattern")

    @tool
    def grep(args: str) -> str:
        """Run grep.

        Args:
            args: its command line.
        """
        return parser.parse_args(shlex.split(args)).pattern

    def turns(task: dict[str, str]) -> list[str]:
        args = "--bogus" if task["answer"] == "3" else task["answer"]
        return [f'<tool_call>{{"name": "grep", "arguments": {{"args": "{args}"}}}}</tool_call>',
                task["answer"]]  # fmt: skip

    def make() -> ToolEnv:
        return ToolEnv([grep], tasks=TASKS, rubric=Rubric([lambda completion: 1.0], names=["one"]))

    episodes = rollout(make, ScriptedPolicy(turns), deadline=DEADLINE_S)
    assert [t.status for t in episodes] == ["ok"] * len(TASKS)
    errors = {t.task_index: t.turns[0].tool_errors for t in episodes}
    assert errors.pop(3) == ["'grep' raised SystemExit: 2"]
    assert all(found == [] for found in errors.values())


@pytest.mark.parametrize("threaded", [False, True], ids=["on-the-loop", "threaded"])
@pytest.mark.parametrize("kind", sorted(RAISED))
def test_a_reward_function_raising_it_makes_the_episode_error(kind: str, threaded: bool) -> None:
    """``error`` and scored, with its traceback, as any other reward failure: not a lost
    rollout, and not an episode waiting forever (past the deadline: ``late``, dropped)."""
    make_error = RAISED[kind]

    def judge(completion: str) -> float:
        raise make_error()

    def make() -> ToolEnv:
        return ToolEnv([], tasks=TASKS[:2], rubric=Rubric([judge], threaded=threaded))

    episodes = rollout(make, ScriptedPolicy(["done"]), deadline=DEADLINE_S)
    assert [t.status for t in episodes] == ["error", "error"]
    assert all(t.scores == {"judge": None} for t in episodes)
    assert all(kind in (t.error or "").strip().splitlines()[-1] for t in episodes), episodes[
        0
    ].error


def test_a_judge_finding_no_match_with_next_is_scored_not_waited_for() -> None:
    """The reported case: ``next(...)`` over users, on a thread, for a reply naming nobody."""
    users = [{"name": "ann"}]

    def judge(completion: str) -> float:
        return float(next(u for u in users if u["name"] == completion)["name"] == "ann")

    def make() -> ToolEnv:
        return ToolEnv([], tasks=TASKS[:1], rubric=Rubric([judge], threaded=True))

    [nobody] = rollout(make, ScriptedPolicy(["zzz"]), deadline=DEADLINE_S)
    [ann] = rollout(make, ScriptedPolicy(["ann"]), deadline=DEADLINE_S)
    assert (nobody.status, nobody.scores) == ("error", {"judge": None})
    assert (ann.status, ann.scores) == ("ok", {"judge": 1.0})


async def test_a_real_cancellation_still_cancels_the_rollout() -> None:
    """The episode's own cancellation is not the tool's error: it ends the rollout task."""
    started = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Wait."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    def make() -> ToolEnv:
        return ToolEnv([wait_forever], tasks=TASKS[:1])

    call = '<tool_call>{"name": "wait_forever", "arguments": {}}</tool_call>'
    running = asyncio.ensure_future(arollout(make, ScriptedPolicy([call, "done"])))
    await asyncio.wait_for(started.wait(), DEADLINE_S)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


def test_ctrl_c_on_the_event_loop_still_stops_the_run() -> None:
    """A `KeyboardInterrupt` raised on the loop may be the user's Ctrl-C: it goes on (on a
    worker thread no signal arrives, so there it is the function's failure)."""

    def judge(completion: str) -> float:
        raise KeyboardInterrupt

    def make() -> ToolEnv:
        return ToolEnv([], tasks=TASKS[:1], rubric=Rubric([judge]))

    with pytest.raises(KeyboardInterrupt):
        rollout(make, ScriptedPolicy(["done"]), deadline=DEADLINE_S)
