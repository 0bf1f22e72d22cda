"""`rollout`: group sampling, concurrency, per-episode failure isolation, summaries."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from typing import Any

import pytest

import agentgym
from agentgym import (
    Completion,
    ConfigError,
    EnvPool,
    ModelError,
    Rubric,
    ScriptedPolicy,
    ToolCall,
    ToolEnv,
    Trajectory,
    Turn,
    arollout,
    get_parser,
    rollout,
    summarize,
    tool,
)
from agentgym._rollout import plan_episodes

TASKS = [{"prompt": f"task {i}", "answer": str(i)} for i in range(4)]
WAIT = get_parser("hermes").render("", [ToolCall("wait", {})])


@tool
async def async_wait() -> str:
    """Wait one second without blocking the loop."""
    await asyncio.sleep(1)
    return "waited"


@tool
def sync_wait() -> str:
    """Wait one second in a worker thread."""
    time.sleep(1)
    return "waited"


def says_answer(completion: str, answer: str) -> float:
    return float(completion == answer)


class WaitEnv(ToolEnv):
    """One slow tool named ``wait``; tasks i answer ``str(i)``."""

    def __init__(self, slow_tool=async_wait) -> None:
        wait = agentgym.Tool(slow_tool.fn, "wait", "Wait.", slow_tool.parameters,
                             is_async=slow_tool.is_async)  # fmt: skip
        super().__init__([wait], tasks=TASKS, rubric=Rubric([says_answer]))


def answer_after_wait(task: dict[str, Any]) -> list[str]:
    return [WAIT, task["answer"]]


def test_group_sampling_order_and_seeds() -> None:
    trajectories = rollout(WaitEnv, ScriptedPolicy(["0"]), num_tasks=3, group_size=2, seed=10)
    assert len(trajectories) == 6
    assert [t.task_index for t in trajectories] == [0, 0, 1, 1, 2, 2]
    assert [t.group_index for t in trajectories] == [0, 1] * 3
    assert [t.task["prompt"] for t in trajectories] == [f"task {i // 2}" for i in range(6)]
    assert len({t.seed for t in trajectories}) == 6
    assert min(t.seed for t in trajectories) == 10
    assert [t.final_reward for t in trajectories] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert all(t.env_id == "WaitEnv" for t in trajectories)


def test_all_tasks_by_default_and_task_dicts() -> None:
    assert len(rollout(WaitEnv, ScriptedPolicy(["x"]))) == len(TASKS)
    custom = {"prompt": "custom", "answer": "c"}
    [t] = rollout(WaitEnv, ScriptedPolicy(["c"]), tasks=[custom])
    assert t.task == custom and t.task_index is None and t.final_reward == 1.0


def test_registered_id_and_env_kwargs() -> None:
    env = agentgym.make("calculator", num_tasks=2)
    trajectories = rollout(
        "calculator", ScriptedPolicy(env.reference_turns), group_size=2,
        env_kwargs={"num_tasks": 2},
    )  # fmt: skip
    assert len(trajectories) == 4
    assert all(t.status == "ok" and t.final_reward == 1.0 for t in trajectories)
    assert all(
        t.env_id == "calculator" and t.scores["used_calculator"] == 1.0 for t in trajectories
    )


def test_scripted_policy_callable_of_task() -> None:
    trajectories = rollout(WaitEnv, ScriptedPolicy(lambda task: [task["answer"]]), num_tasks=4)
    assert [t.final_reward for t in trajectories] == [1.0] * 4
    assert [t.turns[0].text for t in trajectories] == ["0", "1", "2", "3"]


def test_async_slow_tool_runs_concurrently() -> None:
    start = time.perf_counter()
    trajectories = rollout(WaitEnv, ScriptedPolicy(answer_after_wait), group_size=4)
    wall = time.perf_counter() - start
    assert len(trajectories) == 16
    assert all(t.status == "ok" and t.final_reward == 1.0 for t in trajectories)
    assert all(t.messages[3]["content"] == "waited" for t in trajectories)
    assert wall < 3.0, f"16 one-second tools took {wall:.1f} s"


def test_sync_slow_tool_runs_in_threads() -> None:
    start = time.perf_counter()
    trajectories = rollout(
        lambda: WaitEnv(sync_wait), ScriptedPolicy(answer_after_wait), num_tasks=4, group_size=2
    )
    wall = time.perf_counter() - start
    assert len(trajectories) == 8 and all(t.final_reward == 1.0 for t in trajectories)
    assert wall < 4.0, f"8 one-second sync tools took {wall:.1f} s"


def test_max_concurrency_one_serializes() -> None:
    start = time.perf_counter()
    trajectories = rollout(
        WaitEnv, ScriptedPolicy(answer_after_wait), num_tasks=3, max_concurrency=1
    )
    wall = time.perf_counter() - start
    assert [t.status for t in trajectories] == ["ok"] * 3
    assert wall >= 2.9, f"3 serialized one-second tools took only {wall:.1f} s"


class FlakyEnv(WaitEnv):
    """Raises in ``areset`` on task 1 and in ``astep`` on task 2."""

    async def areset(self, *, seed=None, options=None):
        if (options or {}).get("task") == 1:
            raise RuntimeError("reset exploded")
        return await super().areset(seed=seed, options=options)

    async def astep(self, action):
        if self.state.task_index == 2:
            raise KeyError("step exploded")
        return await super().astep(action)


def test_env_failure_marks_only_that_episode() -> None:
    trajectories = rollout(FlakyEnv, ScriptedPolicy(lambda task: [task["answer"]]))
    assert [t.status for t in trajectories] == ["ok", "error", "error", "ok"]
    assert (
        "Traceback" in trajectories[1].error
        and "RuntimeError: reset exploded" in trajectories[1].error
    )
    assert "KeyError: 'step exploded'" in trajectories[2].error
    assert trajectories[0].error is None and trajectories[3].error is None
    assert [trajectories[i].final_reward for i in (0, 3)] == [1.0, 1.0]


def test_a_recorded_traceback_holds_only_the_episodes_own_error() -> None:
    """Not the sync adapter's own check for a running loop, chained before it."""
    errors = [t.error for t in rollout(FlakyEnv, ScriptedPolicy(lambda task: [task["answer"]]))]
    failed = [e for e in errors if e]
    assert len(failed) == 2
    for error in failed:
        assert error.startswith("Traceback (most recent call last):")
        assert error.count("Traceback") == 1
        assert "no running event loop" not in error
        assert "During handling of the above exception" not in error


class CountedEnv(FlakyEnv):
    """`FlakyEnv` that numbers its instances and logs ``(instance, event)`` into ``log``."""

    def __init__(self, log: list[tuple[int, str]]) -> None:
        super().__init__()
        self.log, self.number = log, 1 + sum(event == "made" for _, event in log)
        log.append((self.number, "made"))

    async def areset(self, *, seed=None, options=None):
        self.log.append((self.number, f"reset {(options or {}).get('task')} seed {seed}"))
        await asyncio.sleep(0)  # a real env waits somewhere: the slots' episodes overlap
        return await super().areset(seed=seed, options=options)

    async def aclose(self) -> None:
        self.log.append((self.number, "closed"))
        await super().aclose()


def test_envs_are_made_once_per_slot_and_reset_for_each_episode() -> None:
    log: list[tuple[int, str]] = []
    answers = ScriptedPolicy(lambda task: [task["answer"]])
    trajectories = rollout(lambda: CountedEnv(log), answers, tasks=[0, 3], group_size=3,
                           max_concurrency=2, seed=5)  # fmt: skip
    assert [(t.status, t.final_reward) for t in trajectories] == [("ok", 1.0)] * 6
    assert [n for n, event in log if event == "made"] == [1, 2]  # two at a time: two envs
    resets = sorted(event for _, event in log if event.startswith("reset"))
    assert resets == sorted(f"reset {s.task} seed {s.seed}" for s in plan_episodes([0, 3], 3, 5))
    assert sorted(n for n, event in log if event == "closed") == [1, 2]  # closed at the end
    # the same records as a fresh env per episode (`run_episode` makes and closes its own)
    fresh = [
        asyncio.run(agentgym.run_episode(lambda: CountedEnv([]), answers, spec, env_id="<lambda>"))
        for spec in plan_episodes([0, 3], 3, 5)
    ]
    assert [_record(t) for t in trajectories] == [_record(t) for t in fresh]


def _record(trajectory: Trajectory) -> dict[str, Any]:
    """What an episode recorded, without its timings."""
    record = trajectory.to_dict()
    del record["timings"]
    for turn in record["turns"]:
        del turn["policy_seconds"], turn["env_seconds"]
    return record


def test_an_env_whose_episode_failed_is_closed_and_never_reused() -> None:
    log: list[tuple[int, str]] = []
    trajectories = rollout(lambda: CountedEnv(log), ScriptedPolicy(lambda task: [task["answer"]]),
                           tasks=[0, 1, 2, 3], max_concurrency=1)  # fmt: skip
    assert [t.status for t in trajectories] == ["ok", "error", "error", "ok"]
    # env 1 plays task 0 and fails task 1's reset: closed; env 2 fails task 2's step: closed
    assert log == [
        (1, "made"), (1, "reset 0 seed 0"), (1, "reset 1 seed 1"), (1, "closed"),
        (2, "made"), (2, "reset 2 seed 2"), (2, "closed"),
        (3, "made"), (3, "reset 3 seed 3"), (3, "closed"),
    ]  # fmt: skip


async def test_a_pool_of_the_callers_keeps_its_envs_across_rollouts_until_closed() -> None:
    log: list[tuple[int, str]] = []
    answers = ScriptedPolicy(lambda task: [task["answer"]])
    async with EnvPool(lambda: CountedEnv(log)) as envs:
        first = await arollout(envs, answers, tasks=[0, 3], group_size=2, max_concurrency=2)
        second = await arollout(envs, answers, tasks=[3, 0], group_size=2, max_concurrency=2)
        assert [t.status for t in first + second] == ["ok"] * 8
        assert not [event for _, event in log if event == "closed"]  # still the caller's
        made = [n for n, event in log if event == "made"]
        assert len(made) == 2 and sum(event.startswith("reset") for _, event in log) == 8
        with pytest.raises(ConfigError, match="env_kwargs belong to EnvPool"):
            await arollout(envs, answers, tasks=[0], env_kwargs={"x": 1})
    assert sorted(n for n, event in log if event == "closed") == made


def test_a_pool_serves_one_event_loop() -> None:
    envs = EnvPool(lambda: CountedEnv([]))
    rollout(envs, ScriptedPolicy(["0"]), tasks=[0])
    with pytest.raises(ConfigError, match="made on another event loop"):
        rollout(envs, ScriptedPolicy(["0"]), tasks=[0])  # a new asyncio.run: a new loop
    asyncio.run(envs.aclose())  # closing needs no particular loop, and frees the pool
    [again] = rollout(envs, ScriptedPolicy(["0"]), tasks=[0])  # on yet another loop
    assert again.status == "ok" and len(envs.idle) == 1  # the caller's pool stays open
    asyncio.run(envs.aclose())


class FailingPolicy:
    """Fails for the task whose answer is "1"; answers correctly otherwise."""

    async def generate(self, messages, tools, *, max_tokens=None, task=None) -> Completion:
        if task["answer"] == "1":
            raise ModelError("server answered 503")
        return Completion(text=task["answer"])


def test_model_error_is_infra_error() -> None:
    trajectories = rollout(WaitEnv, FailingPolicy(), num_tasks=3)
    assert [t.status for t in trajectories] == ["ok", "infra_error", "ok"]
    assert "ModelError: server answered 503" in trajectories[1].error
    assert trajectories[1].final_reward is None


def test_policy_gets_tool_schemas_and_max_tokens() -> None:
    seen: list[tuple] = []

    class Recorder:
        async def generate(self, messages, tools, *, max_tokens=None, task=None):
            seen.append(
                ([t["function"]["name"] for t in tools], max_tokens, messages[-1]["content"])
            )
            return Completion(text="0", completion_ids=[5, 6], prompt_ids=[1])

    [t] = rollout(WaitEnv, Recorder(), num_tasks=1, max_tokens_per_turn=17)
    assert seen == [(["wait"], 17, "task 0")]
    assert t.turns[0].completion_ids == [5, 6] and t.turns[0].completion_mask == [1, 1]


def test_truncated_status() -> None:
    [t] = rollout(WaitEnv, ScriptedPolicy(["<tool_call>bad</tool_call>"] * 10), num_tasks=1)
    assert t.status == "truncated" and len(t.turns) == 8 and t.final_reward == 0.0


def test_skip_keys_dict_tasks_by_position() -> None:
    custom = [{"prompt": f"custom {i}", "answer": f"c{i}"} for i in range(2)]
    policy = ScriptedPolicy(lambda task: [task["answer"]])
    full = rollout(WaitEnv, policy, tasks=custom, group_size=2, seed=5)
    assert [t.key for t in full] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    done = [full[1], full[2]]
    rest = rollout(WaitEnv, policy, tasks=custom, group_size=2, seed=5, skip={t.key for t in done})
    assert [(t.key, t.seed, t.task) for t in rest] == [
        (t.key, t.seed, t.task) for t in (full[0], full[3])
    ]
    assert all(t.final_reward == 1.0 for t in rest)


class StepRewardEnv(WaitEnv):
    """Pays 0.25 for every turn, so step and final rewards differ."""

    def step_reward(self, state, new_messages) -> float:
        return 0.25


def test_step_and_final_rewards_are_recorded_apart() -> None:
    [t] = rollout(StepRewardEnv, ScriptedPolicy(answer_after_wait), num_tasks=1)
    assert t.step_rewards == [0.25, 0.25] and t.final_reward == 1.0
    assert t.total_reward == 1.5


class UnsaidStepRewardEnv(agentgym.Env):
    """Reports a final reward but not what the step itself paid."""

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        return [{"role": "user", "content": "hi"}], {}

    async def astep(self, action):
        return [{"role": "assistant", "content": "x"}], 1.0, True, False, {"final_reward": 1.0}


def test_final_reward_without_step_reward_is_an_error() -> None:
    [t] = rollout(UnsaidStepRewardEnv, ScriptedPolicy(["x"]), tasks=[0])
    assert t.status == "error" and "info['step_reward']" in t.error


def test_on_episode_called_once_per_episode() -> None:
    seen: list[Trajectory] = []
    trajectories = rollout(
        WaitEnv, ScriptedPolicy(["0"]), num_tasks=2, group_size=3, on_episode=seen.append
    )
    assert len(seen) == 6
    assert sorted(map(id, seen)) == sorted(map(id, trajectories))


@pytest.mark.parametrize(
    "kwargs", [{"group_size": 0}, {"max_concurrency": 0}, {"env_kwargs": {"bogus": 1}}]
)
def test_bad_rollout_arguments_raise(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        rollout("calculator", ScriptedPolicy([]), num_tasks=1, **kwargs)


def test_unknown_env_id_raises_before_running() -> None:
    with pytest.raises(agentgym.UnknownEnvError):
        rollout("calculater", ScriptedPolicy([]))


async def test_rollout_inside_event_loop_points_to_arollout() -> None:
    with pytest.raises(ConfigError, match="arollout"):
        rollout(WaitEnv, ScriptedPolicy(["0"]), num_tasks=1)
    [t] = await arollout(WaitEnv, ScriptedPolicy(["0"]), num_tasks=1)
    assert t.final_reward == 1.0


def test_a_rollout_turn_counts_its_tool_results_cut_to_be_shown() -> None:
    """The env cut the result to its max_tool_result_chars; the played turn says so, so a
    run's metrics and an eval's summary count what the model read only the start of."""
    calculate = get_parser("hermes").render("", [ToolCall("calculate", {"expression": "9 * 9"})])
    [t] = rollout("calculator", ScriptedPolicy([calculate, "81"]), num_tasks=1,
                  env_kwargs={"max_tool_result_chars": 1})  # fmt: skip
    [result] = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert result.startswith("8\n[cut: the result has 2 characters")
    assert [turn.tool_results_cut for turn in t.turns] == [1, 0]
    assert summarize([t])["tools/results_cut"] == 1
    assert Trajectory.from_dict(t.to_dict()).turns[0].tool_results_cut == 1


def _traj(status: str, final: float | None, step: float = 0.0, **scores: float) -> Trajectory:
    return Trajectory(
        env_id="x", status=status, final_reward=final, scores=dict(scores),
        turns=[Turn(reward=step, tool_errors=["e"], tool_results_cut=1)],
    )  # fmt: skip


def test_summarize_counts_and_excludes_failed_episodes() -> None:
    trajectories = [
        _traj("ok", 1.0, correct=1.0),
        _traj("truncated", 0.0, step=0.5, correct=0.0),
        _traj("error", None),  # scoring crashed: the policy's episode, reward 0
        _traj("infra_error", None),
        _traj("late", None),
        _traj("ok", 0.0),
    ]
    trajectories[-1].info["forfeit"] = "wreck: the world is gone"
    summary = summarize(trajectories, wall_seconds=2.0)
    assert summary["episodes"] == 6
    assert summary["status"] == {"ok": 2, "truncated": 1, "error": 1, "infra_error": 1, "late": 1}
    assert summary["reward/mean"] == pytest.approx(0.375)  # (1.0 + 0.5 + 0 + 0.0) / 4
    assert summary["scores/correct"] == pytest.approx(0.5)
    assert summary["tools/errors"] == summary["tools/results_cut"] == 6
    assert summary["episodes/forfeit"] == 1
    assert summary["time/episodes_per_second"] == 3.0


def test_summary_names_its_token_count_a_total_and_gives_the_mean() -> None:
    """It printed ``tokens/completion: 384`` for 10 one-turn episodes: a total read as a mean."""
    one, two = _traj("ok", 1.0), _traj("ok", 0.0)
    one.turns[0].completion_ids, two.turns[0].completion_ids = [1, 2, 3], [4]
    summary = summarize([one, two])
    assert summary["tokens/completions_total"] == 4 and summary["tokens/per_episode"] == 2.0
    assert "tokens/completion" not in summary


def test_an_error_episode_counts_as_the_policys_but_infra_error_as_nobodys() -> None:
    """Left out of the mean, an episode whose answer crashed the scoring raised the eval's
    figure; the trainer already scores it with the reward it got (0 without one)."""
    summary = summarize([_traj("error", None), _traj("ok", 1.0)])
    assert summary["reward/mean"] == 0.5 and summary["pass@1"] == 0.5
    summary = summarize([_traj("infra_error", None)])
    assert summary["reward/mean"] is None and summary["status"]["ok"] == 0


def test_summary_gives_pass_at_k_per_task_and_the_means_standard_error() -> None:
    def played(task: int, *rewards: float | None) -> list[Trajectory]:
        return [
            Trajectory(env_id="x", task_position=task, group_index=g, final_reward=r,
                       status="infra_error" if r is None else "ok")
            for g, r in enumerate(rewards)
        ]  # fmt: skip

    summary = summarize(
        played(0, 1.0, 0.0, 0.0, 0.0) + played(1, 1.0, 1.0, 1.0, 1.0) + played(2, 0.0, 0.5, None)
    )
    # task 2 has two scored episodes: it counts for pass@1 and pass@2, not pass@4
    assert summary["pass@1"] == pytest.approx((0.25 + 1 + 0) / 3)
    assert summary["pass@2"] == pytest.approx(((1 - 3 / 6) + 1 + 0) / 3)
    assert summary["pass@4"] == pytest.approx(1.0)
    assert "pass@3" not in summary and "pass@8" not in summary
    # episodes of one task are not independent: the error is over the three tasks' means
    task_means = [0.25, 1.0, 0.25]
    stderr = statistics.stdev(task_means) / len(task_means) ** 0.5
    assert summary["reward/stderr"] == pytest.approx(stderr)
    one_each = summarize(played(0, 1.0) + played(1, 0.0) + played(2, 0.5))
    assert one_each["reward/stderr"] == pytest.approx(statistics.stdev([1, 0, 0.5]) / 3**0.5)
    # of the three tasks played more than once, task 1 alone scored all its episodes alike
    assert summary["reward/frac_zero_variance_groups"] == pytest.approx(1 / 3)
    assert "reward/frac_zero_variance_groups" not in one_each  # no task played twice


@pytest.mark.parametrize(("n", "c", "k"), [(10, 3, 1), (10, 3, 5), (200, 13, 100), (5, 0, 2)])
def test_pass_at_k_is_the_humaneval_estimator(n: int, c: int, k: int) -> None:
    from agentgym._summary import pass_at_k

    # the numerically stable product form of Chen et al. (2021)
    expected = 1.0 if n - c < k else 1.0 - math.prod(1 - k / i for i in range(n - c + 1, n + 1))
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(3, 4, 1)
