"""`arollout` with a user's mistakes: refused once up front, or recorded per episode, never hidden.

Each case is something a user wrote by hand (a callback, a policy, an env of their own), and
each must end as one clear error or as a recorded episode, with every env closed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from agentgym import (
    Completion,
    ConfigError,
    Env,
    Rubric,
    ScriptedPolicy,
    ToolEnv,
    arollout,
    read_jsonl,
    summarize,
    write_jsonl,
)
from trainers._advantages import trajectory_advantages

TASKS = [{"prompt": f"task {i}", "answer": str(i)} for i in range(4)]


def says_answer(completion: str, answer: str) -> float:
    return float(completion == answer)


class CountedEnv(ToolEnv):
    """Tool-less env that counts how many of its instances exist and how many were closed."""

    made = 0
    closed = 0

    def __init__(self) -> None:
        super().__init__([], tasks=TASKS, rubric=Rubric([says_answer]))
        CountedEnv.made += 1

    async def aclose(self) -> None:
        CountedEnv.closed += 1
        await super().aclose()


class SlowPolicy:
    """Answers after ``delay(task)`` seconds, so episodes end at different times."""

    async def generate(self, messages, tools, *, max_tokens=None, task=None) -> Completion:
        await asyncio.sleep(0.05 * int(task["answer"]))
        return Completion(text=task["answer"])


async def test_a_callback_that_raises_stops_the_rollout_and_closes_every_env() -> None:
    CountedEnv.made = CountedEnv.closed = 0

    def boom(trajectory: Any) -> None:
        raise RuntimeError("my progress bar broke")

    with pytest.raises(RuntimeError, match="progress bar"):
        await arollout(CountedEnv, SlowPolicy(), tasks=[0, 1, 2, 3], on_episode=boom)
    assert CountedEnv.made == 4  # one per concurrent episode
    assert CountedEnv.closed == CountedEnv.made  # the other three did not play on, unclosed


class NoTasksEnv(Env):
    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        return [], {}

    async def astep(self, action):
        return [], 0.0, True, False, {}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_tasks": 3}, "no task list to play.*tasks=\\[...\\]"),
        ({"num_tasks": -1}, "num_tasks must be an int >= 1"),
        ({"tasks": [{}], "max_tokens_per_turn": -1}, "max_tokens_per_turn must be an int >= 1"),
    ],
)
async def test_a_plan_that_would_play_nothing_or_fail_everywhere_is_refused(
    kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        await arollout(NoTasksEnv, ScriptedPolicy(["hi"]), **kwargs)


class SyncPolicy:
    def generate(self, messages, tools, *, max_tokens=None, task=None) -> Completion:
        return Completion(text="hi")


class TextPolicy:
    async def generate(self, messages, tools, *, max_tokens=None, task=None) -> str:
        return "hi"


async def test_a_policy_without_async_generate_is_refused_up_front() -> None:
    for policy in (SyncPolicy(), lambda messages, tools: "hi"):
        with pytest.raises(ConfigError, match="async def generate"):
            await arollout(CountedEnv, policy, tasks=[0])  # type: ignore[arg-type]


async def test_a_policy_returning_text_fails_its_episodes_naming_the_contract() -> None:
    [trajectory] = await arollout(CountedEnv, TextPolicy(), tasks=[0])  # type: ignore[arg-type]
    assert trajectory.status == "error"
    assert "returned str, not an agentgym.Completion" in (trajectory.error or "")


class WildRewardEnv(Env):
    """An env of one step whose own reward is ``options["task"]`` (a bug in a user's scoring
    code: NaN, an overflow, a huge number)."""

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.reward = (options or {})["task"]
        return [{"role": "user", "content": "go"}], {}

    async def astep(self, action):
        return [{"role": "assistant", "content": "ok"}], self.reward, True, False, {}


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), -1e200, 2e12])
async def test_an_env_reward_out_of_range_makes_the_episode_error_scored_0(reward: float) -> None:
    """Kept as ``error`` episodes are, with its reward, that reward must be one the trainer can
    do arithmetic on: 1e200 made the std of its group raise OverflowError, inf made every
    advantage of its group NaN, and `summarize` raised on it."""
    wild, *fine = await arollout(WildRewardEnv, ScriptedPolicy(["ok"]), tasks=[reward, 1.0, 0.0])
    assert (wild.status, wild.total_reward, wild.final_reward) == ("error", 0.0, None)
    assert "finite number within ±1e+12" in (wild.error or "") and "scored 0" in wild.error
    assert [t.status for t in fine] == ["ok", "ok"]
    assert summarize([wild, *fine])["reward/mean"] == pytest.approx(1 / 3)
    same_task = [dataclasses.replace(t, task_position=0) for t in (wild, *fine)]
    assert all(math.isfinite(a) for a in trajectory_advantages(same_task).values)


async def test_a_reward_at_the_bound_is_kept() -> None:
    [kept] = await arollout(WildRewardEnv, ScriptedPolicy(["ok"]), tasks=[-1e12])
    assert (kept.status, kept.total_reward) == ("ok", -1e12)


@pytest.mark.parametrize("task", [4, -1, "task 0", 1.5, True, None])
async def test_a_task_the_env_does_not_have_is_refused_before_any_episode(task: Any) -> None:
    """`reset` refused it inside every episode: each ended ``error`` with a traceback, and the
    rollout read as a model that failed."""
    CountedEnv.made = CountedEnv.closed = 0
    with pytest.raises(ConfigError, match=r"tasks\[1\] must be a task dict or a task index "
                       r"in \[0, 4\), got "):  # fmt: skip
        await arollout(CountedEnv, ScriptedPolicy(["0"]), tasks=[0, task])
    assert CountedEnv.closed == CountedEnv.made == 1  # the env that counted the tasks


async def test_an_env_without_a_task_list_reads_whatever_task_it_is_given() -> None:
    """Its own `areset` reads ``options["task"]``: a name or any index is its business."""
    named, indexed = await arollout(NoTasksEnv, ScriptedPolicy(["hi"]), tasks=["first", 7])
    assert (named.status, indexed.status, indexed.task_index) == ("ok", "ok", 7)


async def test_numpy_task_indices_are_recorded_as_indices() -> None:
    trajectories = await arollout(CountedEnv, ScriptedPolicy(["0"]), tasks=np.arange(2))
    assert [t.task_index for t in trajectories] == [0, 1]
    assert [type(t.task_index) for t in trajectories] == [int, int]


async def test_summarize_reads_a_written_file_back(tmp_path) -> None:
    trajectories = await arollout(CountedEnv, ScriptedPolicy(["0"]), tasks=[0, 1])
    write_jsonl(trajectories, tmp_path / "t.jsonl")
    summary = summarize(read_jsonl(tmp_path / "t.jsonl"))  # a generator, as read_jsonl gives
    assert summary["episodes"] == 2 and summary["reward/mean"] == 0.5


class ShortLogprobsPolicy:
    """A user's policy with a bug: 4 sampled ids, 2 logprobs."""

    async def generate(self, messages, tools, *, max_tokens=None, task=None) -> Completion:
        return Completion("0", prompt_ids=[1, 2, 3], completion_ids=[5, 6, 7, 8],
                          logprobs=[-0.1, -0.2], finish_reason="stop")  # fmt: skip


async def test_logprobs_that_do_not_pair_with_the_ids_fail_the_episode_naming_both() -> None:
    """The episode ended ``ok`` and the trainer's importance ratios read NaN and other tokens'
    logprobs, silently."""
    [trajectory] = await arollout(CountedEnv, ShortLogprobsPolicy(), tasks=[0])
    assert trajectory.status == "error"
    assert "Completion has 4 completion_ids and 2 logprobs" in (trajectory.error or "")
    assert Completion("x", completion_ids=[1, 2], logprobs=None).logprobs is None  # allowed


async def test_numpy_numbers_in_a_task_read_back_as_numbers(tmp_path) -> None:
    """``json.dumps(default=str)`` wrote ``np.int64(7)`` as ``"7"``: a reward that re-scored
    the read episodes (``answer == 7``) changed."""
    task = {"prompt": "p", "answer": "0", "id": np.int64(7), "ids": np.arange(2), "w": 0.5}
    written = await arollout(CountedEnv, ScriptedPolicy(["0"]), tasks=[task])
    write_jsonl(written, tmp_path / "t.jsonl")
    [back] = read_jsonl(tmp_path / "t.jsonl")
    assert back.task == {"prompt": "p", "answer": "0", "id": 7, "ids": [0, 1], "w": 0.5}


class SilentPolicy:
    """Never answers: the rollout is stopped from outside."""

    async def generate(self, messages, tools, *, max_tokens=None, task=None) -> Completion:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_huge_rollout_holds_a_task_per_player_not_per_episode() -> None:
    """Each episode was a task from the start, waiting on a semaphore: 100,000 of them took
    2.6 s to make before the first episode played, and 1.2 s to cancel when stopped."""
    CountedEnv.made = CountedEnv.closed = 0
    playing = asyncio.ensure_future(
        arollout(CountedEnv, SilentPolicy(), tasks=[0], group_size=100_000, max_concurrency=2)
    )
    while CountedEnv.made < 2:  # both episodes that may play have started
        await asyncio.sleep(0.01)
    assert len(asyncio.all_tasks()) <= 4  # this test, the rollout, its two players
    playing.cancel()
    done, _ = await asyncio.wait([playing], timeout=10)
    assert done == {playing} and playing.cancelled()
    assert CountedEnv.closed == CountedEnv.made == 2
    assert asyncio.all_tasks() == {asyncio.current_task()}
