"""What a Gymnasium user does with an agentgym env: notebooks, spaces, vector envs, specs, copies.

Each test is one step of that journey that used to fail: the sync API inside a running event
loop (a Jupyter cell), spaces shared by every env of a class, `AsyncVectorEnv` refusing the
spaces its workers sent back, ``env.spec`` not recording `make`'s options, and cryptic errors
from ``copy``/``pickle`` and ``render``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import pickle
from collections.abc import Iterator
from typing import Any

import gymnasium
import pytest

import agentgym
from agentgym import ConfigError, Env
from agentgym import _registry as registry_module
from agentgym._env import AssistantTurnSpace, MessagesSpace

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "6 * 7"}}</tool_call>'


class LoopBoundEnv(Env):
    """Remembers the loop its episode started on, as an env holding a client or a lock does."""

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.loop = asyncio.get_running_loop()
        self.messages = [{"role": "user", "content": "hi"}]
        return list(self.messages), {}

    async def astep(self, action):
        same = asyncio.get_running_loop() is self.loop
        new = [{"role": "assistant", "content": str(action)}]
        self.messages += new
        return new, float(same), True, False, {"step_reward": float(same)}


class ReentrantEnv(LoopBoundEnv):
    """An env whose step calls the sync API of the env: a bug that must be named."""

    async def astep(self, action):
        return self.reset()


def _inside_a_running_loop(fn: Any) -> Any:
    """Call ``fn`` as a Jupyter cell would: synchronously, while an event loop runs."""

    async def cell() -> Any:
        return fn()

    return asyncio.run(cell())


def test_the_sync_api_works_inside_a_running_event_loop_as_in_a_notebook() -> None:
    plain_env = agentgym.make("calculator")
    expected = (plain_env.reset(seed=3), plain_env.step(CALL))
    env = agentgym.make("calculator")

    def cell() -> Any:
        played = (env.reset(seed=3), env.step(CALL))
        env.close()
        env.close()  # twice, as Gymnasium allows
        return played

    assert _inside_a_running_loop(cell) == expected
    assert expected[1][0][-1]["content"] == "42"  # the async tool ran


def test_gymnasium_make_wrapped_env_resets_inside_a_running_loop() -> None:
    env = gymnasium.make("agentgym/Calculator-v0")
    obs, info = _inside_a_running_loop(lambda: env.reset(seed=0))
    assert obs[-1]["role"] == "user" and info["task"]["prompt"] == obs[-1]["content"]


def test_an_env_keeps_one_loop_across_plain_and_notebook_calls() -> None:
    env = LoopBoundEnv()
    env.reset(seed=0)  # outside any loop
    _, reward, *_ = _inside_a_running_loop(lambda: env.step("hello"))
    assert reward == 1.0


def test_a_sync_call_from_inside_a_sync_call_is_named() -> None:
    env = ReentrantEnv()
    env.reset(seed=0)
    with pytest.raises(ConfigError, match=r"inside another sync env call.*await env\.areset"):
        env.step("x")
    env.reset(seed=0)
    with pytest.raises(ConfigError, match="inside another sync env call"):
        _inside_a_running_loop(lambda: env.step("x"))


def test_each_env_seeds_and_samples_its_own_spaces() -> None:
    first, second = agentgym.make("calculator"), agentgym.make("calculator")
    assert first.action_space is not second.action_space
    first.action_space.seed(0)
    alone = first.action_space.sample()
    first.action_space.seed(0)
    second.action_space.seed(1)  # another env's seed must not change first's draws
    assert first.action_space.sample() == alone


def test_a_space_set_on_the_env_wins_over_the_default() -> None:
    env = LoopBoundEnv()
    env.action_space = AssistantTurnSpace(max_length=3)
    assert env.action_space == AssistantTurnSpace(max_length=3)
    assert Env.observation_space == MessagesSpace()  # the class keeps its template


@pytest.mark.parametrize("space", [MessagesSpace(), AssistantTurnSpace(max_length=7)], ids=repr)
def test_a_space_equals_its_unpickled_copy(space: gymnasium.Space[Any]) -> None:
    # AsyncVectorEnv compares the spaces its workers send back with its own
    assert pickle.loads(pickle.dumps(space)) == space
    assert AssistantTurnSpace(max_length=7) != AssistantTurnSpace(max_length=8)
    assert MessagesSpace() != AssistantTurnSpace()


def test_async_vector_env_plays_the_calculator() -> None:
    def make() -> gymnasium.Env[Any, Any]:
        return gymnasium.make("agentgym/Calculator-v0")

    envs = gymnasium.vector.AsyncVectorEnv([make, make], shared_memory=False)
    try:
        obs, info = envs.reset(seed=0)
        assert [o[-1]["content"] for o in obs] == list(info["task"]["prompt"])
        obs, reward, terminated, truncated, _ = envs.step((CALL, CALL))
        assert [o[-1]["content"] for o in obs] == ["42", "42"]
        assert not terminated.any() and not truncated.any()
    finally:
        envs.close()


@pytest.fixture
def caps_id() -> Iterator[str]:
    env_id = "journey/Caps-v0"
    agentgym.register(env_id, "agentgym.envs.calculator:CalculatorEnv", max_turns=3)
    yield env_id
    del gymnasium.registry[env_id]
    registry_module._OUR_IDS.discard(env_id)


def test_the_spec_of_a_made_env_records_its_options(caps_id: str) -> None:
    env = agentgym.make(caps_id, max_turns=5)
    assert env.spec is not None and env.spec.kwargs == {"max_turns": 5}
    assert gymnasium.spec(caps_id).kwargs == {"max_turns": 3}  # the registry is untouched
    assert gymnasium.make(env.spec).unwrapped.max_turns == 5
    assert agentgym.make(env.spec).max_turns == 5
    assert agentgym.make(env.spec, max_turns=2).max_turns == 2


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps], ids=lambda f: f.__name__)
def test_copying_a_tool_env_is_one_line_naming_the_fix(how: Any) -> None:
    env = agentgym.make("calculator")
    env.reset(seed=0)
    with pytest.raises(
        ConfigError, match=r"cannot be copied or pickled.*agentgym\.make\(env\.spec\)"
    ):
        how(env)


def test_render_mode_ansi_shows_the_conversation_and_survives_the_spec() -> None:
    """`gymnasium.make(id, render_mode="ansi")` raised a TypeError from the env's __init__."""
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make("agentgym/Calculator-v0", render_mode="ansi")
    _, info = env.reset(seed=0)
    env.step(CALL)
    text = env.render()
    assert text.startswith("[system]\n") and f"[user]\n{info['task']['prompt']}" in text
    assert '[assistant]\n-> calculate({"expression": "6 * 7"})\n\n[tool calculate]\n42' in text
    check_env(env.unwrapped)  # Gymnasium's checker renders in ansi mode and wants a str
    assert env.unwrapped.render_mode == "ansi" and env.spec.kwargs["render_mode"] == "ansi"
    assert agentgym.make(env.spec).render_mode == "ansi"  # rebuilt with the same mode
    assert agentgym.make("calculator", render_mode="ansi").render_mode == "ansi"


def test_render_without_a_mode_says_how_to_get_one() -> None:
    env = gymnasium.make("agentgym/Calculator-v0")
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match=r"render_mode='ansi'.*env\.unwrapped\.messages"):
        env.render()


@pytest.mark.parametrize("make", [gymnasium.make, agentgym.make], ids=["gymnasium", "agentgym"])
def test_a_render_mode_the_env_lacks_is_one_line(make: Any) -> None:
    with pytest.warns(UserWarning) if make is gymnasium.make else contextlib.nullcontext():
        with pytest.raises(
            ConfigError, match=r"no render_mode 'rgb_array'; it has \['ansi', 'human'\]"
        ):
            make("agentgym/Calculator-v0", render_mode="rgb_array")


def test_render_mode_human_prints_each_message_once_as_the_episode_grows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Gymnasium's human mode draws during ``step``; here ``make(render_mode="human")`` was a
    ConfigError. The sync calls print what is new; `render()` prints what an awaited `astep`
    left unprinted and returns None."""
    env = gymnasium.make("agentgym/Calculator-v0", render_mode="human")
    _, info = env.reset(seed=0)
    shown = capsys.readouterr().out
    assert shown.startswith("[system]\n") and shown.endswith(
        f"[user]\n{info['task']['prompt']}\n\n"
    )
    env.step(CALL)
    assert capsys.readouterr().out == (
        '[assistant]\n-> calculate({"expression": "6 * 7"})\n\n[tool calculate]\n42\n\n'
    )
    assert env.render() is None and capsys.readouterr().out == ""  # nothing new to print
    asyncio.run(env.unwrapped.astep("The answer is 42."))
    assert capsys.readouterr().out == ""  # the async path prints nothing by itself
    assert env.render() is None and capsys.readouterr().out == "[assistant]\nThe answer is 42.\n\n"
    env.reset(seed=1)  # a new episode prints from its start again
    assert capsys.readouterr().out.startswith("[system]\n")


class DrawnEnv(LoopBoundEnv):
    """A Gymnasium-style env that takes ``render_mode`` itself, with a mode of its own."""

    metadata = {"render_modes": ["human"]}

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__()
        self.render_mode, self.asked_for = render_mode, render_mode


def test_an_env_that_takes_render_mode_itself_gets_it() -> None:
    env = DrawnEnv(render_mode="human")
    assert env.asked_for == "human" and env.render_mode == "human"


def test_a_new_env_does_not_inherit_draws_from_the_class_template() -> None:
    Env.action_space.seed(0)  # someone seeded the class's template
    seeded = AssistantTurnSpace(seed=0)
    env = LoopBoundEnv()
    # the env's space starts unseeded, as a Gymnasium env's does: the template itself, or a
    # copy of it, would draw the seeded texts
    assert [env.action_space.sample() for _ in range(5)] != [seeded.sample() for _ in range(5)]


def test_a_sync_tool_runs_inside_a_running_loop() -> None:
    @agentgym.tool
    def double(x: int) -> int:
        """Double a number.

        Args:
            x: the number.
        """
        return 2 * x

    env = agentgym.ToolEnv([double], tasks=[{"prompt": "double 21", "answer": "42"}])
    call = '<tool_call>{"name": "double", "arguments": {"x": 21}}</tool_call>'
    obs, *_ = _inside_a_running_loop(lambda: (env.reset(seed=0), env.step(call))[1])
    assert obs[-1]["content"] == "42"


class GymnasiumStyleEnv(Env):
    """Written as a Gymnasium env: sync ``reset``/``step`` overridden, no ``areset``/``astep``."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.messages = [{"role": "user", "content": "hi"}]
        return list(self.messages), {}

    def step(self, action):
        return [{"role": "assistant", "content": str(action)}], 1.0, True, False, {}


class GymnasiumStyleStepEnv(LoopBoundEnv):
    """Has `areset`, but its step is Gymnasium's sync one."""

    astep = Env.astep

    def step(self, action):
        return [], 0.0, True, False, {}


def test_a_gymnasium_style_env_still_works_through_the_sync_api() -> None:
    env = GymnasiumStyleEnv()
    assert env.reset(seed=0) == ([{"role": "user", "content": "hi"}], {})
    assert env.np_random_seed == 0


@pytest.mark.parametrize(
    ("env_type", "method"), [(GymnasiumStyleEnv, "reset"), (GymnasiumStyleStepEnv, "step")]
)
def test_a_rollout_of_a_gymnasium_style_env_names_the_async_method_to_write(
    env_type: type[Env], method: str
) -> None:
    (played,) = agentgym.rollout(env_type, agentgym.ScriptedPolicy(["ok"]), tasks=[0])
    assert played.status == "error"
    last = (played.error or "").strip().splitlines()[-1]
    assert f"overrides the sync {method}() but not async a{method}()" in last
    assert f"async def a{method}" in last
