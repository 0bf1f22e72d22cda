"""`arollout(deadline=...)`: what finished comes back; late episodes are cut, closed and marked.

Episodes are held with events that are never set, so "late" never depends on a race: only the
deadline can end them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentgym import ConfigError, Env, InfraError, ScriptedPolicy, Trajectory, arollout

#: Long enough for a few scripted episodes on a loaded two-core machine, short for a test.
DEADLINE = 1.0
POLICY = ScriptedPolicy(["one", "two", "three"])
FAST: dict[str, Any] = {"name": "fast"}
SLOW: dict[str, Any] = {"name": "slow"}
Log = list[tuple[str, str]]


class GateEnv(Env):
    """Three turns; on task `SLOW` the second step waits on ``gate`` (never set here).

    ``log`` records, per task name, what happened to the env: ``"created"``, ``"cancelled"``
    (the wait was interrupted), ``"closed"`` (`aclose` ran). ``waiting`` is set once a slow
    episode is blocked.
    """

    def __init__(self, log: Log, gate: asyncio.Event, waiting: asyncio.Event) -> None:
        super().__init__()
        self.log, self.gate, self.waiting = log, gate, waiting
        self.name = ""
        self.turn = 0

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        task, self.turn = (options or {})["task"], 0
        self.name = task["name"]
        self.log.append((self.name, "created"))
        self.messages = [{"role": "user", "content": f"task {self.name}"}]
        return list(self.messages), {"task": task}

    async def astep(self, action):
        self.turn += 1
        if self.name == "slow" and self.turn == 2:
            self.waiting.set()
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.log.append((self.name, "cancelled"))
                raise
        new = [{"role": "assistant", "content": action.text}]
        if self.turn < 3:
            new.append({"role": "user", "content": "go on"})
            return new, 0.0, False, False, {"step_reward": 0.0}
        return new, 1.0, True, False, {"step_reward": 0.0, "final_reward": 1.0}

    async def aclose(self) -> None:
        self.log.append((self.name, "closed"))


def gate_env(log: Log, waiting: asyncio.Event | None = None) -> Any:
    return lambda: GateEnv(log, asyncio.Event(), waiting or asyncio.Event())


async def test_the_deadline_returns_what_finished_and_marks_the_rest_late() -> None:
    log: Log = []
    seen: list[Trajectory] = []
    trajectories = await arollout(
        gate_env(log), POLICY, tasks=[FAST, SLOW, FAST], deadline=DEADLINE, on_episode=seen.append
    )
    assert [t.status for t in trajectories] == ["ok", "late", "ok"]
    fast, slow = trajectories[0], trajectories[1]
    assert fast.final_reward == 1.0 and len(fast.turns) == 3
    # the late one: cut inside its second step, first turn kept, no reward, env closed
    assert [t.text for t in slow.turns] == ["one"]
    assert slow.final_reward is None and slow.scores == {} and slow.error is None
    assert slow.messages[-1] == {"role": "user", "content": "go on"}
    assert [event for name, event in log if name == "slow"] == ["created", "cancelled", "closed"]
    assert sorted(t.status for t in seen) == ["late", "ok", "ok"]  # on_episode saw it too
    assert slow.timings["total"] >= DEADLINE * 0.9


async def test_episodes_not_started_by_the_deadline_are_late_and_never_create_an_env() -> None:
    log: Log = []
    seen: list[Trajectory] = []
    trajectories = await arollout(
        gate_env(log), POLICY, tasks=[SLOW, FAST, FAST], max_concurrency=1, deadline=DEADLINE,
        on_episode=seen.append,
    )  # fmt: skip
    assert [t.status for t in trajectories] == ["late"] * 3
    assert [len(t.turns) for t in trajectories] == [1, 0, 0]
    assert [t.key for t in trajectories] == [(0, 0), (1, 0), (2, 0)]
    assert trajectories[2].messages == [] and trajectories[2].final_reward is None
    assert [name for name, event in log if event == "created"] == ["slow"]
    assert log[-1] == ("slow", "closed")
    assert len(seen) == 3


class OwnTimeoutEnv(GateEnv):
    """Raises a TimeoutError of its own (a tool's timeout): an error, not a late episode."""

    async def astep(self, action):
        raise TimeoutError("the tool timed out")


async def test_a_timeout_of_the_env_is_an_error_not_late() -> None:
    log: Log = []
    [trajectory] = await arollout(
        lambda: OwnTimeoutEnv(log, asyncio.Event(), asyncio.Event()), POLICY, tasks=[FAST],
        deadline=60,
    )  # fmt: skip
    assert trajectory.status == "error"
    assert "TimeoutError: the tool timed out" in (trajectory.error or "")
    assert log[-1] == ("fast", "closed")


async def test_cancelling_the_rollout_still_cancels_it_and_closes_envs() -> None:
    log: Log = []
    waiting = asyncio.Event()
    run = asyncio.create_task(arollout(gate_env(log, waiting), POLICY, tasks=[SLOW], deadline=60))
    await waiting.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert log == [("slow", "created"), ("slow", "cancelled"), ("slow", "closed")]


async def test_cancelling_the_rollout_closes_the_envs_waiting_for_a_next_episode() -> None:
    log: Log = []
    waiting = asyncio.Event()
    run = asyncio.create_task(arollout(gate_env(log, waiting), POLICY, tasks=[SLOW, FAST]))
    await waiting.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # the fast episode's env finished and waited in the pool for another episode
    assert log == [
        ("slow", "created"), ("fast", "created"), ("slow", "cancelled"), ("slow", "closed"),
        ("fast", "closed"),
    ]  # fmt: skip


async def test_an_episode_timeout_cuts_only_the_episode_past_it() -> None:
    """Each episode gets ``episode_timeout`` from its own start: with one slot, the fast
    episodes queued behind the slow one still play in full once it is cut (a rollout-wide
    deadline of the same length would have cut them unstarted)."""
    log: Log = []
    trajectories = await arollout(
        gate_env(log), POLICY, tasks=[SLOW, FAST, FAST], max_concurrency=1,
        episode_timeout=DEADLINE,
    )  # fmt: skip
    assert [t.status for t in trajectories] == ["late", "ok", "ok"]
    assert [t.text for t in trajectories[0].turns] == ["one"]  # cut in its second step
    assert ("slow", "cancelled") in log and ("slow", "closed") in log


@pytest.mark.parametrize("deadline", [0, -1.0])
@pytest.mark.parametrize("name", ["deadline", "episode_timeout"])
async def test_a_deadline_must_be_positive(name: str, deadline: float) -> None:
    with pytest.raises(ConfigError, match=f"{name} must be > 0"):
        await arollout(gate_env([]), POLICY, tasks=[FAST], **{name: deadline})


class InfraOnCancelEnv(GateEnv):
    """Turns the deadline's cancellation into an `InfraError`, as a sandbox client might."""

    async def astep(self, action):
        try:
            return await super().astep(action)
        except asyncio.CancelledError:
            raise InfraError("sandbox call interrupted") from None


async def test_whatever_the_cut_raises_a_deadline_episode_is_late() -> None:
    log: Log = []
    [trajectory] = await arollout(
        lambda: InfraOnCancelEnv(log, asyncio.Event(), asyncio.Event()), POLICY, tasks=[SLOW],
        deadline=DEADLINE,
    )  # fmt: skip
    assert trajectory.status == "late" and trajectory.error is None
    assert log[-2:] == [("slow", "cancelled"), ("slow", "closed")]
