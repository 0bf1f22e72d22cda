"""Slow sync reward functions (a judge over a blocking HTTP client): threads, timeout, warning.

A sync reward function runs on the event loop, where every other episode waits for it; one
named in ``Rubric(threaded=...)`` runs on a worker thread instead, under ``timeout``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

import pytest

from agentgym import (
    ConfigError,
    InfraError,
    Rubric,
    ScriptedPolicy,
    ToolEnv,
    arollout,
    rollout,
    tool,
)

TASKS = [{"prompt": f"task {i}", "answer": str(i)} for i in range(8)]


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


def env_with(rubric: Rubric) -> type[ToolEnv]:
    class JudgedEnv(ToolEnv):
        def __init__(self) -> None:
            super().__init__([noop], tasks=TASKS, rubric=rubric)

    return JudgedEnv


def test_threaded_judges_of_concurrent_episodes_wait_side_by_side() -> None:
    """Eight judges meet at a barrier: only calls that overlap get past it (on the event loop
    the first would wait alone until the barrier breaks, and its episode would be ``error``)."""
    barrier = threading.Barrier(len(TASKS), timeout=30)

    def judge(completion: str) -> float:
        barrier.wait()
        return 1.0

    env = env_with(Rubric([judge], threaded=True))
    trajectories = rollout(env, ScriptedPolicy(["done"]), max_concurrency=len(TASKS))
    assert [t.status for t in trajectories] == ["ok"] * len(TASKS)
    assert [t.scores for t in trajectories] == [{"judge": 1.0}] * len(TASKS)


def test_an_episodes_threaded_judges_wait_side_by_side_and_score_in_order() -> None:
    """Two judges of one episode meet at a barrier: called one after the other, the first
    would wait alone until the barrier broke; the scores keep the rubric's order."""
    barrier = threading.Barrier(2, timeout=30)

    def correct(completion: str) -> float:
        barrier.wait()
        return 1.0

    def polite(completion: str) -> float:
        barrier.wait()
        return 0.5

    def length(completion: str) -> float:  # on the loop, between them
        return 0.25

    rubric = Rubric([correct, length, polite], threaded=["correct", "polite"])
    result = asyncio.run(rubric.score({"completion": "x"}))
    assert list(result.scores.items()) == [("correct", 1.0), ("length", 0.25), ("polite", 0.5)]
    assert result.reward == 1.75 and not result.errors


def test_an_infra_error_lets_the_other_judges_go_and_reads_their_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The episode is infra_error at once: a judge still waiting is not waited for, and one
    that already failed leaves no 'exception was never retrieved' behind."""
    release = threading.Event()

    def waits(completion: str) -> float:
        release.wait(30)
        return 1.0

    def fails(completion: str) -> float:
        raise ValueError("judge failed")

    async def sandbox_down(completion: str) -> float:
        await asyncio.sleep(0.05)  # the threaded judges are running by now
        raise InfraError("the sandbox is gone")

    rubric = Rubric([sandbox_down, waits, fails], threaded=["waits", "fails"])
    started = time.monotonic()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            with pytest.raises(InfraError, match="the sandbox is gone"):
                asyncio.run(rubric.score({"completion": "x"}))
            gc.collect()  # an unread failure is reported when its task is collected
    finally:
        release.set()
    assert time.monotonic() - started < 20  # not the 30 s the waiting judge would take
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_threaded_judge_past_its_timeout_counts_as_raised_and_is_scored() -> None:
    """``error``, not ``infra_error``: the model's reply can make a judge slow, and a trainer
    drops ``infra_error`` episodes instead of scoring them."""
    release = threading.Event()

    def judge(completion: str) -> float:
        release.wait(30)
        return 1.0

    def length(completion: str) -> float:
        return 0.5

    env = env_with(Rubric([judge, length], threaded=["judge"], timeout=0.2))
    started = time.monotonic()
    try:
        [t] = rollout(env, ScriptedPolicy(["done"]), num_tasks=1)
    finally:
        release.set()
    assert time.monotonic() - started < 20  # not the 30 s the judge would wait
    assert t.status == "error" and t.scores == {"judge": None, "length": 0.5}
    assert "'judge' timed out after 0.2 s" in (t.error or "")


async def test_cancelling_an_episode_while_its_judge_runs_on_a_thread() -> None:
    """The episode's cancellation reaches it at once; the judge's thread is abandoned."""
    started, release = threading.Event(), threading.Event()

    def judge(completion: str) -> float:
        started.set()
        release.wait(30)
        return 1.0

    env = env_with(Rubric([judge], threaded=True))
    running = asyncio.ensure_future(arollout(env, ScriptedPolicy(["done"]), num_tasks=1))
    try:
        assert await asyncio.to_thread(started.wait, 30)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(running, 10)
    finally:
        release.set()


def test_a_sync_judge_that_holds_the_event_loop_is_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def slow_judge(completion: str) -> float:
        time.sleep(0.03)  # the blocking call under test (over 20 ms), not a wait for a thread
        return 1.0

    def quick(completion: str) -> float:
        return 1.0

    env = env_with(Rubric([slow_judge, quick]))
    with caplog.at_level(logging.WARNING, logger="agentgym._rubric"):
        [first] = rollout(env, ScriptedPolicy(["done"]), num_tasks=1)
        assert not caplog.records  # one call held it: maybe an import, or the scheduler
        trajectories = rollout(env, ScriptedPolicy(["done"]), num_tasks=2, max_concurrency=1)
    assert [t.status for t in [first, *trajectories]] == ["ok", "ok", "ok"]
    warned = [r.getMessage() for r in caplog.records if "held the event loop" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "'slow_judge'" in warned[0] and "threaded=['slow_judge']" in warned[0]
    assert "'quick'" not in warned[0]  # microseconds: not named


async def _async_judge(completion: str) -> float:
    return 1.0


def _sync_judge(completion: str) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threaded": ["_async_judge"]}, r"threaded names \['_async_judge'\].*async one"),
        ({"threaded": ["judge"]}, r"threaded names \['judge'\].*\['_sync_judge'\]"),
        ({"threaded": "_sync_judge", "timeout": 0}, "timeout must be a number of seconds > 0"),
        ({"threaded": True, "timeout": float("nan")}, "timeout must be"),
        ({"threaded": True, "timeout": True}, "timeout must be"),
    ],
)
def test_threads_and_timeouts_that_cannot_apply_are_refused(
    kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        Rubric([_sync_judge, _async_judge], **kwargs)  # type: ignore[arg-type]


def test_a_timeout_for_functions_that_all_run_on_the_loop_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"applies to async functions and to sync ones run on "
                       r"threads.*threaded=True"):  # fmt: skip
        Rubric([_sync_judge], timeout=5)


def test_an_async_judge_past_the_timeout_counts_as_raised_and_is_scored() -> None:
    """A judge that never answers (a server that accepted the connection and went quiet)
    held its episode, and the rollout or eval waiting on it, forever: the timeout covers
    async functions too."""
    cleaned_up = []

    async def judge(completion: str) -> float:
        try:
            await asyncio.Event().wait()  # never set: the call under test never returns
        finally:
            cleaned_up.append(True)
        return 1.0

    env = env_with(Rubric([judge, _sync_judge], timeout=0.2))
    [t] = rollout(env, ScriptedPolicy(["done"]), num_tasks=1)
    assert t.status == "error" and t.scores == {"judge": None, "_sync_judge": 1.0}
    assert "'judge' timed out after 0.2 s" in (t.error or "")
    assert cleaned_up == [True]  # cancelled where it waited, its cleanup run


def test_threaded_true_leaves_async_functions_on_the_loop() -> None:
    rubric = Rubric([_sync_judge, _async_judge], threaded=True, timeout=1)
    result = asyncio.run(rubric.score({"completion": "x"}))
    assert result.scores == {"_sync_judge": 1.0, "_async_judge": 1.0} and not result.errors


def test_a_call_the_scheduler_set_aside_is_not_named() -> None:
    """On a loaded machine a reward of microseconds was descheduled for 0.44 s and named as
    holding the loop, with advice (a thread) that would not help. Preemption cannot be made
    to happen on cue, so the decision is fed the counters here; the real counters are read
    around every call (the sleeping judge above is still named: its sleep is a wait)."""
    from agentgym._rubric import _held_by_itself, _own_time

    cpu, waits = _own_time()
    assert waits is not None  # Linux counts a thread's voluntary waits
    assert not _held_by_itself((cpu, waits), (cpu + 0.001, waits))  # set aside, no wait
    assert _held_by_itself((cpu, waits), (cpu + 0.001, waits + 1))  # it waited (I/O, sleep)
    assert _held_by_itself((cpu, waits), (cpu + 0.05, waits))  # it computed
    assert _held_by_itself((cpu, None), (cpu, None))  # not counted: the wall time decides
    time.sleep(0.001)
    assert _own_time()[1] > waits  # a sleep counts as a wait of the thread's own


def test_a_function_is_named_when_it_held_the_loop_in_two_calls_and_half_of_them() -> None:
    """One call that held it (an import on first use; the GIL taken by another thread, a wait
    as a sleep is) named the quickstart's own reward on a loaded machine."""
    from agentgym._rubric import _holds_the_loop

    assert not _holds_the_loop([True])  # the first call imported something
    assert _holds_the_loop([True, True])  # a judge that blocks: every call
    assert _holds_the_loop([False, True, False, True])
    assert not _holds_the_loop([True, False, False, False, False, True, False, False])  # load


async def test_a_judge_that_begins_to_hold_the_loop_after_many_fast_calls_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Judged over the process's life, 4 calls that held the loop after 60 fast ones were
    under half of them, and the judge was never named however long it went on blocking."""
    calls = 0

    def late_blocker(completion: str) -> float:
        nonlocal calls
        calls += 1
        if calls > 60:
            time.sleep(0.03)  # the blocking call under test (over 20 ms)
        return 1.0

    rubric = Rubric([late_blocker])
    with caplog.at_level(logging.WARNING, logger="agentgym._rubric"):
        for _ in range(64):
            await rubric.score({"completion": ""})
    warned = [r.getMessage() for r in caplog.records if "held the event loop" in r.getMessage()]
    assert len(warned) == 1 and "'late_blocker'" in warned[0], warned
