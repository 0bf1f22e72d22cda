"""The rollout engine: many episodes at once, each an independent asyncio task.

One episode flows one way, and the engine only records what each stage hands it::

    task -> env.areset -> policy -> env.astep -> ... -> (rubric, inside the env) -> Trajectory

The env never reads the engine's record: each step's ``info`` says what the step rewarded
(``step_reward``, and ``final_reward`` when the episode ends), and the engine copies it.
Episodes share nothing but the policy, so one waiting on a slow tool or a long generation
never holds up the others, and a failing episode is recorded (``error`` / ``infra_error``
with its traceback) while the rest of the run goes on.

Envs are built once per concurrent slot, not once per episode: an env whose episode ended
cleanly starts the next one with ``reset`` (Gymnasium's contract), so task lists, tool
schemas and tool servers are made once per rollout, or once per `EnvPool` the caller keeps
across rollouts. An env whose episode raised, was cut by the deadline or was cancelled is
closed and never reused.

Throughput: admission is continuous (a semaphore over per-episode tasks: a finished episode's
slot goes to the next one at once), so while some episodes wait on tools the others keep the
model busy. An optional deadline bounds a rollout's wall time: episodes still running then are
cancelled through the normal path (their env is closed, releasing sandboxes) and returned as
``late``, with the turns they had played and no reward.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import numbers
import time
import traceback
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ._deadline import episode_deadline
from ._env import Env
from ._errors import ConfigError, ConversationError, InfraError
from ._own_loop import own_loop, run_caught
from ._policies import Policy, PolicyEpisode, start_episode
from ._registry import make
from ._run_to_end import run_to_end
from ._stop import running_loop
from ._tasks import MAX_TASKS
from ._tool_calls import cancel_and_wait
from ._trajectory import MAX_ABS_REWARD, Trajectory, Turn
from ._types import Completion, Message

EnvFactory = Callable[[], Env]

#: Episodes in flight when the policy does not say how large the engine's batch is.
DEFAULT_CONCURRENCY = 256
#: Seconds `EnvPool.aclose` gives each env's close before it logs the env as left open and
#: goes on to the next (``EnvPool(..., close_timeout=...)``).
CLOSE_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)


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
    check_episode_count(len(tasks), group_size)
    tasks = [_as_index(task) for task in tasks]
    return [
        EpisodeSpec(task, task if isinstance(task, int) else None, g, seed + i * group_size + g, i)
        for i, task in enumerate(tasks)
        for g in range(group_size)
    ]


def check_episode_count(num_tasks: int, group_size: int) -> None:
    """Refuse a ``group_size`` below 1, or a plan past `MAX_TASKS` episodes in all.

    Why the cap: each planned episode is an object made up front; ``-g 100000000`` took
    21 GB and stalled the machine instead of saying no.
    """
    if group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {group_size}")
    if num_tasks * group_size > MAX_TASKS:
        raise ConfigError(
            f"{num_tasks:,} tasks x group_size {group_size:,} is {num_tasks * group_size:,} "
            f"episodes, more than agentgym plays at once ({MAX_TASKS:,}); play fewer"
        )


def _as_index(task: Any) -> Any:
    """A task index of any integer type (numpy's too) as an int; a task dict as it is."""
    if isinstance(task, numbers.Integral) and not isinstance(task, bool):
        return int(task)
    return task


async def run_episode(
    make_env: EnvFactory,
    policy: Policy,
    spec: EpisodeSpec,
    *,
    env_id: str = "",
    max_tokens_per_turn: int | None = None,
    deadline_at: float | None = None,
) -> Trajectory:
    """Play one episode to the end; never raises for env, tool, policy or reward failures.

    ``deadline_at`` is an event-loop time (`asyncio.get_running_loop().time()`); when it
    passes first, the episode is cancelled where it stands, its env closed as usual, and it is
    returned with status ``late``, its finished turns and no reward. None: no deadline.
    """
    return await _run_episode(
        _OneEnvPerEpisode(make_env), policy, spec, env_id=env_id,
        max_tokens_per_turn=max_tokens_per_turn, deadline_at=deadline_at,
    )  # fmt: skip


async def _run_episode(
    envs: _OneEnvPerEpisode,
    policy: Policy,
    spec: EpisodeSpec,
    *,
    env_id: str,
    max_tokens_per_turn: int | None,
    deadline_at: float | None,
) -> Trajectory:
    """`run_episode` on an env from ``envs``, handed back with whether it may be reused."""
    trajectory = _new_trajectory(spec, env_id)
    started = time.perf_counter()
    env: Env | None = None
    reusable = False
    clock = asyncio.timeout_at(deadline_at)
    try:
        env = envs.take()
        with episode_deadline(deadline_at):
            async with clock:
                await _play(env, policy, spec, trajectory, max_tokens_per_turn)
        reusable = True
    except Exception as exc:
        if clock.expired():  # our deadline (whatever the cut raised), not the env's own timeout
            trajectory.status = "late"
        elif isinstance(exc, InfraError):
            trajectory.status, trajectory.error = "infra_error", traceback.format_exc()
        else:
            trajectory.status, trajectory.error = "error", traceback.format_exc()
    finally:
        if env is not None:
            await envs.give_back(env, trajectory, reusable)
    trajectory.timings = {
        "total": time.perf_counter() - started,
        "policy": sum(t.policy_seconds for t in trajectory.turns),
        "env": sum(t.env_seconds for t in trajectory.turns),
    }
    return trajectory


def _new_trajectory(spec: EpisodeSpec, env_id: str) -> Trajectory:
    return Trajectory(
        env_id=env_id, task_index=spec.task_index, task_position=spec.task_position,
        group_index=spec.group_index, seed=spec.seed,
    )  # fmt: skip


async def _play(
    env: Env,
    policy: Policy,
    spec: EpisodeSpec,
    trajectory: Trajectory,
    max_tokens_per_turn: int | None,
) -> None:
    """Reset, then turn after turn until the env ends the episode; records into ``trajectory``.

    Each turn is recorded as soon as it is played, so an episode cut short keeps its turns.
    """
    reset = await env.areset(seed=spec.seed, options={"task": spec.task})
    messages, info = _reset_result(env, reset)
    trajectory.task = info.get("task")
    trajectory.messages = messages  # grows with what every step appends
    tools = getattr(env, "tool_schemas", [])
    episode = start_episode(policy, tools, task=trajectory.task, seed=spec.seed)
    try:
        info, truncated = await _turns(env, episode, trajectory, max_tokens_per_turn)
    finally:
        end = getattr(episode, "aclose", None)  # optional: users' episode handles may lack it
        if end is not None:
            await end()
    _record_outcome(trajectory, info, truncated)


def _shape(value: Any) -> str:
    """``tuple[list, str]``: a value's type, and its items' for a tuple."""
    if isinstance(value, tuple):
        return f"tuple[{', '.join(type(item).__name__ for item in value)}]"
    return type(value).__name__


def _reset_result(env: Env, result: Any) -> tuple[list[Message], dict[str, Any]]:
    """``areset``'s ``(messages, info)``, refused by name when a user's env returns another shape.

    Why: an ``areset`` returning only its messages unpacked into the wrong names, and the
    episode's error was "'NoneType' object is not subscriptable" from deep inside the loop.
    """
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], list)
            and isinstance(result[1], dict)):  # fmt: skip
        raise ConfigError(
            f"{type(env).__name__}.areset must return (messages, info), a list and a dict, as "
            f"Gymnasium's reset returns (observation, info); it returned {_shape(result)}"
        )
    return result


async def _turns(
    env: Env, episode: PolicyEpisode, trajectory: Trajectory, max_tokens_per_turn: int | None
) -> tuple[dict[str, Any], bool]:
    """Turn after turn until the env ends the episode; returns the last info and truncation."""
    done = truncated = False
    info: dict[str, Any] = {}
    while not done:
        t0 = time.perf_counter()
        try:
            limit = _turn_limit(env, episode, max_tokens_per_turn)
            completion = await _next_turn(episode, trajectory, limit)
        except ConversationError as exc:  # the model's turns made it unservable: scored
            info, truncated = await env.atruncate(), True
            trajectory.info["truncated_by"] = str(exc)
            break
        t1 = time.perf_counter()
        new_messages, reward, terminated, truncated, info = await env.astep(completion)
        turn = Turn.from_completion(
            completion, reward=_step_reward(reward, info),
            tool_errors=list(info.get("tool_errors", [])),
            tool_results_cut=int(info.get("tool_results_cut", 0)),
        )  # fmt: skip
        turn.policy_seconds, turn.env_seconds = t1 - t0, time.perf_counter() - t1
        trajectory.turns.append(turn)
        trajectory.messages.extend(new_messages)
        _record_mode(trajectory, episode)  # after each turn: a cut episode keeps it too
        done = terminated or truncated
    _record_mode(trajectory, episode)
    return info, truncated


def _record_mode(trajectory: Trajectory, episode: PolicyEpisode) -> None:
    """How the episode trains, and why it switched to ``per_turn`` midway if it did."""
    trajectory.mode = episode.mode
    reason = getattr(episode, "mode_reason", "")  # optional: users' episode handles may lack it
    if reason:
        trajectory.info["mode_reason"] = reason


def _turn_limit(env: Env, episode: PolicyEpisode, max_tokens_per_turn: int | None) -> int | None:
    """The turn's token limit: the one asked for (or the policy's own), cut to the budget.

    The budget is what the env's episode token budget has left (``episode_tokens_left``,
    optional: `ToolEnv` has it); a policy without a limit of its own gets the budget's.
    """
    left = getattr(env, "episode_tokens_left", None)
    if left is None:
        return max_tokens_per_turn
    own = max_tokens_per_turn or getattr(episode, "max_tokens", None)  # a TokenEpisode's
    return left if own is None else min(own, left)


async def _next_turn(
    episode: PolicyEpisode, trajectory: Trajectory, max_tokens: int | None
) -> Completion:
    """The one place the engine asks the policy for the next assistant turn."""
    completion = await episode.generate(trajectory.messages, max_tokens=max_tokens)
    if not isinstance(completion, Completion):  # a user's policy: name the contract
        raise TypeError(
            f"the policy returned {type(completion).__name__}, not an agentgym.Completion; "
            "return Completion(text=...) from generate"
        )
    return completion


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
    if "forfeit" in info:  # a call destroyed what the episode is scored on (`Forfeit`)
        trajectory.info["forfeit"] = str(info["forfeit"])
    if "teardown_error" in info:  # the env's cleanup failed after scoring: the score stands
        trajectory.info["teardown_error"] = str(info["teardown_error"])
    reward_errors = info.get("reward_errors") or {}
    if reward_errors:
        trajectory.status = "error"
        trajectory.error = "\n".join(
            f"reward function {k!r}:\n{v}" for k, v in reward_errors.items()
        )
    elif not abs(total := trajectory.total_reward) <= MAX_ABS_REWARD:  # NaN fails too
        trajectory.status = "error"  # an env's own step or final reward, or weights' sum
        trajectory.error = (
            f"the env's rewards add up to {total} (final {trajectory.final_reward}, per turn "
            f"{trajectory.step_rewards}): a reward must be a finite number within "
            f"±{MAX_ABS_REWARD:g} (a NaN would make every advantage of the episode's group NaN); "
            "the episode is scored 0"
        )
        trajectory.final_reward = None  # an `error` episode keeps its reward: a sane one
        for turn in trajectory.turns:
            turn.reward = 0.0
    elif truncated:
        trajectory.status = "truncated"


class _OneEnvPerEpisode:
    """A new env for each episode, closed when it ends: `run_episode` alone."""

    def __init__(self, make_env: EnvFactory) -> None:
        self.make_env = make_env
        self.close_timeout: float = CLOSE_TIMEOUT_S

    def take(self) -> Env:
        """The env for the next episode: a new one, built now."""
        return self.make_env()

    async def give_back(self, env: Env, trajectory: Trajectory, reusable: bool) -> None:
        """Close ``env`` within ``close_timeout``; what went wrong goes on the episode it served.

        A close that fails or outlasts the deadline is ``info["close_error"]`` (`_close`):
        without the deadline, a close that hung (a server that would not stop) hung its
        episode, and with it the whole rollout, eval or trainer step.
        """
        problem = await _close(env, self.close_timeout, "to end its episode")
        if problem is not None:
            trajectory.info["close_error"] = problem


class EnvPool(_OneEnvPerEpisode):
    """Envs kept between episodes, so each is built once per concurrent slot, not per episode.

    Building an env can cost more than playing an episode on it (a ToolAPI-v0 env that no
    other env shares the shop service with starts it, ~90 ms, and stops it on close,
    ~140 ms), and `make` runs on the event loop, holding up every episode. `arollout` makes
    a pool for each call and closes it on return; pass your own to keep the envs across
    calls (a trainer's steps), and close it when done::

        async with EnvPool("calculator", {"num_tasks": 2200}) as envs:
            for step in range(steps):
                trajectories = await arollout(envs, policy, tasks=..., group_size=8)

    Only an env whose episode ended cleanly comes back; it holds no episode resources then
    (`ToolEnv` releases them when the episode ends), and its next ``reset`` starts afresh.
    One whose episode raised, was cut or was cancelled is closed. The envs may hold objects of
    the event loop they were made on, so a pool serves one loop until it is closed: `arollout`
    on another raises `ConfigError`. A closed pool holds no env and serves the next loop.

    Args:
        env: a registered env id (resolved by `agentgym.make`) or a zero-argument factory.
        env_kwargs: keyword arguments for `make` when ``env`` is an id.
        close_timeout: seconds `aclose` waits for each env's close (`CLOSE_TIMEOUT_S`).
    """

    def __init__(self, env: str | EnvFactory, env_kwargs: dict[str, Any] | None = None, *,
                 close_timeout: float = CLOSE_TIMEOUT_S) -> None:
        if isinstance(close_timeout, bool) or not isinstance(close_timeout, numbers.Real) or not (
                0 < close_timeout < float("inf")):  # nan fails this too
            raise ConfigError(f"close_timeout must be a finite number of seconds > 0, "
                              f"got {close_timeout!r}")
        self.env_id: str
        self.env_id, make_env = _env_factory(env, env_kwargs or {})
        super().__init__(make_env)
        self.close_timeout = float(close_timeout)
        self.idle: list[Env] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def take(self) -> Env:
        """The env for the next episode: an idle one if the pool holds one, else a new one."""
        return self.idle.pop() if self.idle else self.make_env()

    def check_loop(self) -> None:
        """Bind the pool to the running event loop, or raise if it serves another one."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise ConfigError(
                "this EnvPool's envs were made on another event loop; "
                "use one pool per loop (e.g. one asyncio.Runner for all rollouts)"
            )

    async def give_back(self, env: Env, trajectory: Trajectory, reusable: bool) -> None:
        """Keep ``env`` for a later episode when ``reusable`` (its episode ended cleanly).

        Any other env is closed as `_OneEnvPerEpisode.give_back` closes it.
        """
        if reusable:
            self.idle.append(env)
        else:
            await super().give_back(env, trajectory, reusable)

    async def aclose(self) -> None:
        """Close the idle envs, freeing the pool for another loop; failed closes are logged.

        A caller cancelled meanwhile (a Ctrl-C, a trainer's shutdown) first waits for the envs
        after the one whose close it cut to close: they stayed open, with their sandboxes and
        servers, and the pool no longer held them.

        Each close has ``close_timeout`` seconds: one still running then (a server that will not
        stop, a sandbox daemon that stopped answering) is cancelled, logged as left open, and
        the next env is closed; it hung the trainer's or eval's shutdown for good. (A close
        stuck in a worker thread is left running, as nothing can stop a thread: `rollout` and
        `train` return after a grace, and the interpreter abandons it at exit: `own_loop`.)
        A close runs
        in a task of its own for that, which hands a KeyboardInterrupt an episode raised on
        this loop back to `aclose` to raise: raised in the task, it escaped the loop's run and
        broke the trainer's shutdown.
        """
        self._loop = None
        envs, self.idle = self.idle, []
        for done, env in enumerate(envs, start=1):
            try:
                await _close(env, self.close_timeout, _NEXT, log_failure=True)
            except asyncio.CancelledError:
                await run_to_end(_close_each(envs[done:], self.close_timeout))
                raise

    async def __aenter__(self) -> EnvPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


#: What `EnvPool.aclose` goes on to when it leaves an env open (`_close`'s warning says so).
_NEXT = "to close the next env"


async def _close_each(envs: list[Env], seconds: float) -> None:
    """Close every env, one after another (`_close`)."""
    for env in envs:
        await _close(env, seconds, _NEXT, log_failure=True)


async def _close(env: Env, seconds: float, then: str, *, log_failure: bool = False) -> str | None:
    """Close ``env`` within ``seconds``; what went wrong, or None when it closed.

    What went wrong is the close's traceback (logged with ``log_failure``: an episode's is
    recorded on it instead, not logged once per episode), or that it was still running at the
    deadline and was left open ``then`` (what the caller goes on to; always logged: each such
    close costs its caller ``seconds``). The close runs in a task of its
    own, so the wait ends at the deadline even when the close does not end when cancelled
    (one waiting for a thread, as a sandbox's does). A caller cancelled meanwhile cancels the
    close and waits for it as long again.
    """
    closing = asyncio.ensure_future(_closed(env))
    try:
        await asyncio.wait([closing], timeout=seconds)
    except asyncio.CancelledError:
        closing.cancel()
        await asyncio.wait([closing], timeout=seconds)
        raise
    if not closing.done():
        closing.cancel()
        left_open = (f"a {type(env).__name__} did not close within {seconds:g} s (close_timeout); "
                     f"left open, with what it holds, {then}")  # fmt: skip
        log.warning("%s", left_open)
        return left_open
    outcome = closing.result()
    if isinstance(outcome, BaseException):
        raise outcome
    if outcome is not None and log_failure:
        log.warning("closing a %s failed:\n%s", type(env).__name__, outcome)
    return outcome


async def _closed(env: Env) -> str | BaseException | None:
    """Close ``env``: None, a failure's traceback, or a KeyboardInterrupt to raise.

    A SystemExit is returned as a KeyboardInterrupt is, for `_close` to raise.

    Why returned: raised in a task, either escapes the loop's run and breaks its shutdown.
    """
    try:
        await env.aclose()
    except Exception:
        return traceback.format_exc()
    except (KeyboardInterrupt, SystemExit) as exc:
        return exc
    return None


async def arollout(
    env: str | EnvFactory | EnvPool,
    policy: Policy,
    *,
    tasks: Sequence[int | dict[str, Any]] | None = None,
    num_tasks: int | None = None,
    group_size: int = 1,
    max_concurrency: int | None = None,
    seed: int = 0,
    max_tokens_per_turn: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
    skip: Collection[tuple[int | None, int]] = (),
    deadline: float | None = None,
    episode_timeout: float | None = None,
) -> list[Trajectory]:
    """Run ``group_size`` episodes for each task, up to ``max_concurrency`` at a time.

    An env is made for each slot and ``reset`` for each of its episodes; one whose episode
    failed, was cut or was cancelled is closed and replaced (`EnvPool`). All are closed on
    return, unless ``env`` is a pool of the caller's.

    Args:
        env: a registered env id (resolved by `agentgym.make`), a zero-argument factory, or
            an `EnvPool` to take envs from (kept open on return, for the next call).
        policy: produces assistant turns (`OpenAIPolicy`, `ScriptedPolicy`, your own).
        tasks: task indices or task dicts; None plays the env's first ``num_tasks`` tasks.
        num_tasks: how many of the env's tasks to play when ``tasks`` is None; None = all.
        group_size: episodes per task (GRPO's G); they differ by seed and by sampling.
        max_concurrency: episodes in flight at once (admission is continuous: a finished
            episode's slot goes to the next at once). For throughput, keep more episodes in
            flight than the engine batches, since episodes waiting on tools generate nothing:
            about the engine's batch (vLLM's ``max_num_seqs``) x (1 + tool time / generation
            time per turn). More only queues requests in the engine, but each slot keeps
            an env instance until the rollout ends (envs are reused, see above) and each
            playing episode holds its sandbox: lower it when those are scarce.
            None: twice the policy's ``max_num_seqs`` when it has one (`VLLMPolicy`), else
            `DEFAULT_CONCURRENCY` (256).
        seed: base seed; episode i of the plan gets ``seed + i``.
        max_tokens_per_turn: passed to the policy as ``max_tokens``.
        env_kwargs: keyword arguments for `make` when ``env`` is an id (a pool has its own).
        on_episode: called with each finished trajectory (progress bars, streaming writes).
        skip: episode keys not to play (already done, when resuming): ``(task_position,
            group_index)`` pairs, ``task_position`` being the task's position in ``tasks``
            (`Trajectory.key` of the finished episodes); the other episodes keep the seeds
            they have in the full plan.
        deadline: seconds from the start of the call after which the rollout returns what
            finished. Episodes still playing are cancelled (their env closed as usual, so
            sandboxes are released) and episodes not yet started are not started; both come
            back with status ``late``: the turns they played, no reward (trainers drop them
            from group statistics). ``on_episode`` is called for them too. None: no deadline.
        episode_timeout: seconds each episode may play, from its start; one still playing
            then is cut the same way and comes back ``late``, while the others go on (an
            evaluation's guard against one episode that never ends: a tool or reward
            without a timeout of its own). None: no limit.

    Returns:
        Trajectories in plan order (task-major, then group index), one per episode.
    """
    started = asyncio.get_running_loop().time()
    if isinstance(env, EnvPool) and env_kwargs:
        raise ConfigError("env_kwargs belong to EnvPool(env, env_kwargs) when env is a pool")
    envs = env if isinstance(env, EnvPool) else EnvPool(env, env_kwargs)
    envs.check_loop()
    env_id = envs.env_id
    if max_concurrency is None:
        max_concurrency = _default_concurrency(policy)
    if max_concurrency < 1:
        raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
    for name, seconds in (("deadline", deadline), ("episode_timeout", episode_timeout)):
        if seconds is not None and not seconds > 0:
            raise ConfigError(f"{name} must be > 0 seconds or None, got {seconds}")
    _check_plan_knobs(policy, num_tasks, max_tokens_per_turn)
    deadline_at = None if deadline is None else started + deadline
    loop = asyncio.get_running_loop()
    played: dict[int, Trajectory] = {}

    async def player(queue: Iterator[tuple[int, EpisodeSpec]]) -> None:
        """Play the plan's next episode until none is left; ``max_concurrency`` of these run.

        Why players, not a task per episode behind a semaphore: 100,000 waiting tasks took
        2.6 s to make before the first episode played, and 1.2 s to cancel when stopped.
        """
        for position, spec in queue:  # one iterator for all: each episode plays once
            if deadline_at is not None and loop.time() >= deadline_at:
                trajectory = _new_trajectory(spec, env_id)  # never started
                trajectory.status = "late"
                trajectory.timings = {"total": 0.0, "policy": 0.0, "env": 0.0}
            else:
                trajectory = await _run_episode(
                    envs, policy, spec, env_id=env_id,
                    max_tokens_per_turn=max_tokens_per_turn,
                    deadline_at=_earlier(deadline_at, episode_timeout),
                )  # fmt: skip
                _stop_if_asked()
            played[position] = trajectory
            if on_episode is not None:
                on_episode(trajectory)

    running: list[asyncio.Task[None]] = []
    try:
        if tasks is None:
            tasks = _env_tasks(envs, env_id, num_tasks)
        else:
            tasks = _checked_tasks(envs, list(tasks))
        plan = [spec for spec in plan_episodes(tasks, group_size, seed) if spec.key not in skip]
        queue = iter(enumerate(plan))
        players = min(max_concurrency, len(plan))
        running = [asyncio.ensure_future(player(queue)) for _ in range(players)]
        await asyncio.gather(*running)
        return [played[position] for position in range(len(plan))]
    finally:  # an on_episode that raised stops the others: each gives its env back first
        await cancel_and_wait(running)
        if envs is not env:  # the caller's pool stays open for its next rollout
            await envs.aclose()


def _stop_if_asked() -> None:
    """Raise the player's cancellation that the episode it just played did not end on.

    Why: Ctrl-C (asyncio's handler) cancels the running task from inside it. Requested just
    before a tool call began, that cancellation was counted in the call's baseline, so the
    call took it for the tool's own `CancelledError` (a tool error); the episode played on,
    and so did its player, through every episode left. That episode's tool result is the
    stop's, not the tool's: it is not kept (a resume plays it again).
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("the rollout was stopped")


def _earlier(deadline_at: float | None, timeout: float | None) -> float | None:
    """The sooner of ``deadline_at`` and ``timeout`` seconds from now (loop times; None: none)."""
    if timeout is None:
        return deadline_at
    ends = asyncio.get_running_loop().time() + timeout
    return ends if deadline_at is None else min(deadline_at, ends)


def _task_count(envs: EnvPool) -> int:
    """How many tasks the pool's envs hold (0: no task list, the env picks its own)."""
    probe = envs.take()  # fails fast on an unknown id or bad kwargs; plays later
    envs.idle.append(probe)
    return len(getattr(probe, "tasks", None) or ())


def _checked_tasks(
    envs: EnvPool, tasks: list[int | dict[str, Any]]
) -> list[int | dict[str, Any]]:
    """``tasks``, refused before any episode plays when one names no task the env has.

    Why: `reset` refuses such a task, but inside each episode: ``tasks=[999]`` or
    ``["HumanEval/5"]`` played every episode to ``error`` with a traceback, and a run read
    as a model that failed. An env without a task list reads its ``options["task"]`` itself
    (any value: a name, an index), so its tasks are left to it.
    """
    count = _task_count(envs) if tasks else 0
    for position, task in enumerate(tasks):
        index = _as_index(task)
        in_range = type(index) is int and 0 <= index < count
        if count and not isinstance(index, dict) and not in_range:
            raise ConfigError(
                f"tasks[{position}] must be a task dict or a task index in [0, {count}), "
                f"got {task!r}"
            )
    return tasks


def _env_tasks(envs: EnvPool, env_id: str, num_tasks: int | None) -> list[int]:
    """The indices of the env's first ``num_tasks`` tasks (all when None)."""
    count = _task_count(envs)
    if not count:
        raise ConfigError(
            f"{env_id} has no task list to play (no `tasks` attribute, or it is empty); "
            "pass tasks=[...] (task indices or task dicts)"
        )
    return list(range(count if num_tasks is None else min(num_tasks, count)))


def _check_plan_knobs(policy: Policy, num_tasks: int | None, max_tokens: int | None) -> None:
    """Mistakes that would otherwise fail every episode, one traceback each, refused once."""
    for name, value in (("num_tasks", num_tasks), ("max_tokens_per_turn", max_tokens)):
        if value is not None and not (isinstance(value, int) and value >= 1):
            raise ConfigError(f"{name} must be an int >= 1 or None, got {value!r}")
    generate = getattr(policy, "generate", None)
    plain_def = inspect.isroutine(generate) and not inspect.iscoroutinefunction(generate)
    if getattr(policy, "start_episode", None) is None and (not callable(generate) or plain_def):
        raise ConfigError(
            f"policy {policy!r} has no `async def generate(messages, tools, *, max_tokens, "
            "task)`; give it one (see agentgym.Policy), or pass a ScriptedPolicy / VLLMPolicy"
        )


def _default_concurrency(policy: Policy) -> int:
    """Twice the engine's batch, so episodes waiting on tools do not leave it underfed."""
    batch = getattr(policy, "max_num_seqs", None)
    return 2 * batch if isinstance(batch, int) and batch > 0 else DEFAULT_CONCURRENCY


def rollout(env: str | EnvFactory | EnvPool, policy: Policy, **kwargs: Any) -> list[Trajectory]:
    """Sync adapter over `arollout` (same arguments); inside async code, await `arollout`.

    It runs its own event loop (`own_loop`, not `asyncio.run`): its end is bounded past tasks
    that ignore cancellation and closes stuck in a thread, and a Ctrl-C in env code leaves no
    stray traceback (`run_caught`).
    """
    if running_loop() is not None:
        raise ConfigError("rollout() called inside a running event loop; use `await arollout(...)`")
    with own_loop("rollout()") as loop:
        return run_caught(loop, _rollout_and_close(env, policy, **kwargs))


async def _rollout_and_close(
    env: str | EnvFactory | EnvPool, policy: Policy, **kwargs: Any
) -> list[Trajectory]:
    """`arollout`, then release the policy's connections while their event loop still runs."""
    try:
        return await arollout(env, policy, **kwargs)
    finally:
        aclose = getattr(policy, "aclose", None)
        if aclose is not None:
            await aclose()
