"""The rollout engine: many episodes at once, each an independent asyncio task.

One episode flows one way, and the engine only records what each stage hands it::

    task -> env.areset -> policy -> env.astep -> ... -> (rubric, inside the env) -> Trajectory

The env never reads the engine's record: each step's ``info`` says what the step rewarded
(``step_reward``, and ``final_reward`` when the episode ends), and the engine copies it.
Episodes share nothing but the policy, so one waiting on a slow tool or a long generation
never holds up the others, and a failing episode is recorded (``error`` / ``infra_error``
with its traceback) while the rest of the run goes on.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ._env import Env
from ._errors import ConfigError, ContextLengthError, InfraError
from ._policies import Policy, PolicyEpisode, start_episode
from ._registry import make
from ._trajectory import Trajectory, Turn
from ._types import Completion

EnvFactory = Callable[[], Env]


@dataclass(frozen=True)
class EpisodeSpec:
    """Which task an episode plays, with which seed, and where it sits in its run.

    ``task_position`` is the task's position in the rollout's task list; with
    ``group_index`` it is the episode's `key`, stable across resumed runs even for task dicts.
    """

    task: int | dict[str, Any]
    task_index: int | None
    group_index: int
    seed: int
    task_position: int = 0

    @property
    def key(self) -> tuple[int, int]:
        """``(task_position, group_index)``, as in `Trajectory.key`."""
        return self.task_position, self.group_index


def _env_factory(env: str | EnvFactory, env_kwargs: dict[str, Any]) -> tuple[str, EnvFactory]:
    if isinstance(env, str):
        return env, lambda: make(env, **env_kwargs)
    if callable(env):
        return getattr(env, "__name__", type(env).__name__), env
    raise ConfigError(f"env must be a registered id or a zero-argument factory, got {env!r}")


def plan_episodes(
    tasks: Sequence[int | dict[str, Any]], group_size: int, seed: int
) -> list[EpisodeSpec]:
    """G episodes per task, task-major, each with its own deterministic seed."""
    if group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {group_size}")
    return [
        EpisodeSpec(task, task if isinstance(task, int) else None, g, seed + i * group_size + g, i)
        for i, task in enumerate(tasks)
        for g in range(group_size)
    ]


async def run_episode(
    make_env: EnvFactory,
    policy: Policy,
    spec: EpisodeSpec,
    *,
    env_id: str = "",
    max_tokens_per_turn: int | None = None,
) -> Trajectory:
    """Play one episode to the end; never raises for env, tool, policy or reward failures."""
    trajectory = Trajectory(
        env_id=env_id, task_index=spec.task_index, task_position=spec.task_position,
        group_index=spec.group_index, seed=spec.seed,
    )  # fmt: skip
    started = time.perf_counter()
    env: Env | None = None
    try:
        env = make_env()
        messages, info = await env.areset(seed=spec.seed, options={"task": spec.task})
        trajectory.task = info.get("task")
        trajectory.messages = messages  # grows with what every step appends
        tools = getattr(env, "tool_schemas", [])
        episode = start_episode(policy, tools, task=trajectory.task, seed=spec.seed)
        done = truncated = False
        while not done:
            t0 = time.perf_counter()
            try:
                completion = await _next_turn(episode, trajectory, max_tokens_per_turn)
            except ContextLengthError as exc:  # too long to go on: truncated, and scored
                info, truncated = await env.atruncate(), True
                trajectory.info["truncated_by"] = str(exc)
                break
            t1 = time.perf_counter()
            new_messages, reward, terminated, truncated, info = await env.astep(completion)
            turn = Turn.from_completion(
                completion, reward=_step_reward(reward, info),
                tool_errors=list(info.get("tool_errors", [])),
            )  # fmt: skip
            turn.policy_seconds, turn.env_seconds = t1 - t0, time.perf_counter() - t1
            trajectory.turns.append(turn)
            trajectory.messages.extend(new_messages)
            done = terminated or truncated
        trajectory.mode = episode.mode
        _record_outcome(trajectory, info, truncated)
    except InfraError:
        trajectory.status, trajectory.error = "infra_error", traceback.format_exc()
    except Exception:
        trajectory.status, trajectory.error = "error", traceback.format_exc()
    finally:
        if env is not None:
            await _close_quietly(env, trajectory)
    trajectory.timings = {
        "total": time.perf_counter() - started,
        "policy": sum(t.policy_seconds for t in trajectory.turns),
        "env": sum(t.env_seconds for t in trajectory.turns),
    }
    return trajectory


async def _next_turn(
    episode: PolicyEpisode, trajectory: Trajectory, max_tokens: int | None
) -> Completion:
    """The one place the engine asks the policy for the next assistant turn."""
    return await episode.generate(trajectory.messages, max_tokens=max_tokens)


def _step_reward(reward: float, info: dict[str, Any]) -> float:
    """The step's own reward, as the env reported it (Gymnasium's reward also holds the final).

    An env whose step carries no final reward may leave ``step_reward`` out: its reward is
    then the step's own. One that reports a final reward must say the step's part, or the
    record would count the final reward twice.
    """
    if "step_reward" in info:
        return float(info["step_reward"])
    if "final_reward" in info:
        raise ConfigError(
            "the env reported info['final_reward'] without info['step_reward']; "
            "an env must report both so the record keeps them apart"
        )
    return float(reward)


def _record_outcome(trajectory: Trajectory, info: dict[str, Any], truncated: bool) -> None:
    trajectory.final_reward = info.get("final_reward")
    trajectory.scores = dict(info.get("scores", {}))
    reward_errors = info.get("reward_errors") or {}
    if reward_errors:
        trajectory.status = "error"
        trajectory.error = "\n".join(
            f"reward function {k!r}:\n{v}" for k, v in reward_errors.items()
        )
    elif truncated:
        trajectory.status = "truncated"


async def _close_quietly(env: Env, trajectory: Trajectory) -> None:
    try:
        await env.aclose()
    except Exception:
        trajectory.info["close_error"] = traceback.format_exc()


async def arollout(
    env: str | EnvFactory,
    policy: Policy,
    *,
    tasks: Sequence[int | dict[str, Any]] | None = None,
    num_tasks: int | None = None,
    group_size: int = 1,
    max_concurrency: int = 64,
    seed: int = 0,
    max_tokens_per_turn: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
    skip: Collection[tuple[int | None, int]] = (),
) -> list[Trajectory]:
    """Run ``group_size`` episodes for each task, up to ``max_concurrency`` at a time.

    Args:
        env: a registered env id (resolved by `agentgym.make`) or a zero-argument factory.
        policy: produces assistant turns (`OpenAIPolicy`, `ScriptedPolicy`, your own).
        tasks: task indices or task dicts; None plays the env's first ``num_tasks`` tasks.
        num_tasks: how many of the env's tasks to play when ``tasks`` is None; None = all.
        group_size: episodes per task (GRPO's G); they differ by seed and by sampling.
        max_concurrency: episodes in flight at once; each env instance is created per episode.
        seed: base seed; episode i of the plan gets ``seed + i``.
        max_tokens_per_turn: passed to the policy as ``max_tokens``.
        env_kwargs: keyword arguments for `make` when ``env`` is an id.
        on_episode: called with each finished trajectory (progress bars, streaming writes).
        skip: episode keys not to play (already done, when resuming): ``(task_position,
            group_index)`` pairs, ``task_position`` being the task's position in ``tasks``
            (`Trajectory.key` of the finished episodes); the other episodes keep the seeds
            they have in the full plan.

    Returns:
        Trajectories in plan order (task-major, then group index), one per episode.
    """
    env_id, make_env = _env_factory(env, env_kwargs or {})
    if max_concurrency < 1:
        raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
    if tasks is None:
        probe = make_env()  # fails fast on an unknown id or bad kwargs
        count = len(getattr(probe, "tasks", ()))
        await probe.aclose()
        tasks = list(range(count if num_tasks is None else min(num_tasks, count)))
    limit = asyncio.Semaphore(max_concurrency)

    async def bounded(spec: EpisodeSpec) -> Trajectory:
        async with limit:
            trajectory = await run_episode(
                make_env, policy, spec, env_id=env_id, max_tokens_per_turn=max_tokens_per_turn
            )
        if on_episode is not None:
            on_episode(trajectory)
        return trajectory

    plan = [spec for spec in plan_episodes(tasks, group_size, seed) if spec.key not in skip]
    return list(await asyncio.gather(*map(bounded, plan)))


def rollout(env: str | EnvFactory, policy: Policy, **kwargs: Any) -> list[Trajectory]:
    """Sync adapter over `arollout` (same arguments); inside async code, await `arollout`."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_rollout_and_close(env, policy, **kwargs))
    raise ConfigError("rollout() called inside a running event loop; use `await arollout(...)`")


async def _rollout_and_close(
    env: str | EnvFactory, policy: Policy, **kwargs: Any
) -> list[Trajectory]:
    """`arollout`, then release the policy's connections while their event loop still runs."""
    try:
        return await arollout(env, policy, **kwargs)
    finally:
        aclose = getattr(policy, "aclose", None)
        if aclose is not None:
            await aclose()
