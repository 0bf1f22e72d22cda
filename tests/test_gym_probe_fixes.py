"""What a Gymnasium probe found: action shapes the space took but `step` crashed on, a closed
ToolAPI env that could not reset, options that were not a dict, the checker's fps warning,
and ``max_episode_steps`` refused without naming ``max_turns``."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym import Completion, ConfigError
from tests.conftest import require

ANSWER = "The answer is 90."  # calculator task 0: "What is 66 + 24?"


@pytest.fixture
def env() -> Any:
    env = agentgym.make("calculator")
    env.reset(seed=0, options={"task": 0})
    return env


def one_line_config_error(call: Callable[[], Any], match: str) -> str:
    with pytest.raises(ConfigError, match=match) as excinfo:
        call()
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


# --- 1. assistant-message actions: what the space holds steps, the rest is one line ----------


def test_content_as_text_parts_is_scored_as_the_same_text(env: Any) -> None:
    parts = [{"type": "text", "text": "The answer "}, {"type": "text", "text": "is 90."}]
    action = {"role": "assistant", "content": parts}
    assert env.action_space.contains(action)
    obs, reward, terminated, _, info = env.step(action)
    assert obs[0] == {"role": "assistant", "content": ANSWER}
    env.reset(seed=0, options={"task": 0})
    _, as_text, *_, text_info = env.step({"role": "assistant", "content": ANSWER})
    assert terminated and (reward, info["scores"]) == (as_text, text_info["scores"])
    assert info["scores"]["correct_answer"] == 1.0


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"content": 123}, r"the action's content must be a str, None or a list of text parts"),
        ({"content": [{"type": "image_url", "image_url": {"url": "x"}}]}, r"content must be"),
        ({"content": [{"type": "text", "text": 5}]}, r"content must be"),
        ({"tool_calls": "abc"}, r"the action's tool_calls must be a list .*got str 'abc'"),
        ({"tool_calls": [None]}, r"tool_calls\[0\] must be \{'function'"),
        ({"tool_calls": [{"function": "calculate"}]}, r"tool_calls\[0\] must be"),
        ({"tool_calls": [{"function": {"arguments": "{}"}}]}, r"tool_calls\[0\] must be"),
        ({"tool_calls": [{"function": {"name": "calculate", "arguments": 5}}]}, r"\[0\] must"),
    ],
)
def test_a_message_step_cannot_read_is_outside_the_space_and_one_line(
    env: Any, fields: dict[str, Any], match: str
) -> None:
    action = {"role": "assistant", **fields}
    assert not env.action_space.contains(action)
    one_line_config_error(lambda: env.step(action), match)
    assert env.state.turn == 0  # refused before the turn counted: the episode goes on
    assert env.step(ANSWER)[2]


def test_a_completion_message_of_a_wrong_shape_is_one_line(env: Any) -> None:
    action = Completion(text="", message={"role": "assistant", "tool_calls": "abc"})
    one_line_config_error(lambda: env.step(action), r"Completion.message's tool_calls must be")


def test_what_the_model_writes_in_a_message_stays_its_own_mistake(env: Any) -> None:
    # the OpenAI shape holds strings the model chose: arguments that are no JSON object, an
    # unknown name; they are tool errors the model reads, as in parsed text, not a refusal
    calls = [
        {"id": "a", "function": {"name": "calculate", "arguments": "[1, 2]"}},
        {"id": "b", "function": {"name": "nope", "arguments": {}}},
    ]
    action = {"role": "assistant", "content": None, "tool_calls": calls}
    assert env.action_space.contains(action)
    _, _, terminated, truncated, info = env.step(action)
    assert not (terminated or truncated) and len(info["tool_errors"]) == 2


# --- 2. ToolAPI: a closed env resets, and the shop's users are counted right -------------------


def test_toolapi_reset_after_close_takes_the_shop_again_while_another_env_holds_it() -> None:
    require("fastapi")
    require("uvicorn")
    env, other = agentgym.make("toolapi"), agentgym.make("toolapi")
    users = env.server.users  # these two, and any env another test left open
    try:
        env.close()
        assert env.server.users == users - 1
        _, info = env.reset(seed=0)
        assert env.server is other.server and env.server.users == users
        for turn in env.reference_turns(info["task"]):
            _, reward, terminated, _, step_info = env.step(turn)
        assert terminated and reward == 1.0 and not step_info["tool_errors"]
    finally:
        env.close()
        env.close()  # twice: the shop is given back once
        other.close()
    assert env.server.users == users - 2


def test_toolapi_resets_after_its_close_stopped_the_shop() -> None:
    require("fastapi")
    require("uvicorn")
    env = agentgym.make("toolapi")
    first = env.server
    env.close()
    try:
        if first.users == 0:  # the shop's last user gave it back: the shop stopped
            assert not first.alive
        _, info = env.reset(seed=0)
        assert env.server.alive
        for turn in env.reference_turns(info["task"]):
            _, reward, terminated, *_ = env.step(turn)
        assert terminated and reward == 1.0
    finally:
        env.close()


# --- 3. reset options that are not a dict ------------------------------------------------------


@pytest.mark.parametrize("options", [3, 0, "task", [("task", 0)]])
def test_reset_options_that_are_not_a_dict_are_one_line(env: Any, options: Any) -> None:
    one_line_config_error(
        lambda: env.reset(options=options), r"options must be a dict whose only key is 'task'"
    )


# --- 4. Gymnasium's env checker ----------------------------------------------------------------


def test_check_env_warns_nothing() -> None:
    env = agentgym.make("calculator")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    assert not [str(w.message) for w in caught if "render_fps" in str(w.message)]
    assert env.metadata["render_fps"] > 0


# --- 5. max_episode_steps given to agentgym.make ---------------------------------------------


def test_make_with_max_episode_steps_names_max_turns() -> None:
    message = one_line_config_error(
        lambda: agentgym.make("calculator", max_episode_steps=2), r"max_episode_steps"
    )
    assert "use max_turns" in message and "gymnasium.make(..., max_episode_steps=N)" in message
    assert agentgym.make("calculator", max_turns=2).max_turns == 2
