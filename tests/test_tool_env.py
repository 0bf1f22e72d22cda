"""`ToolEnv`: bad model input becomes tool messages, the loop, stop conditions, options, rubric."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
from datetime import date
from typing import Any

import pytest

from agentgym import (
    Completion,
    ConfigError,
    Forfeit,
    Rubric,
    SandboxError,
    ScriptedPolicy,
    ToolCall,
    ToolEnv,
    get_parser,
    rollout,
    tool,
)

HERMES = get_parser("hermes")
TASKS = [{"prompt": "What is 2 + 3?", "answer": "5"}, {"prompt": "What is 4 + 4?", "answer": "8"}]


def call(name: str, **arguments: Any) -> str:
    return HERMES.render("", [ToolCall(name, arguments)])


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first.
        b: second.
    """
    return a + b


@tool
def boom() -> str:
    """Always fails."""
    raise ValueError("kaboom")


@tool(timeout=0.1)
async def hang() -> str:
    """Never finishes in time."""
    await asyncio.wait_for(asyncio.Event().wait(), 5)
    return "late"


@tool
def whoami(task: dict, state: Any) -> str:
    """Report the injected task."""
    return f"{task['answer']}@{state.turn}"


@tool
def infra() -> str:
    """The sandbox died."""
    raise SandboxError("container died")


def says_answer(completion: str, answer: str) -> float:
    return float(answer in completion)


def make_env(**kwargs: Any) -> ToolEnv:
    kwargs.setdefault("tasks", TASKS)
    kwargs.setdefault("rubric", Rubric([says_answer]))
    return ToolEnv([add, boom, hang, whoami, infra], **kwargs)


@pytest.fixture
def env() -> ToolEnv:
    env = make_env()
    env.reset(seed=0, options={"task": 0})
    yield env
    env.close()


BAD_INPUTS = {
    "malformed": ("<tool_call>{not json</tool_call>", "malformed"),
    "unknown-tool": (call("subtract", a=1, b=2), "unknown tool 'subtract'"),
    "bad-arguments": (call("add", a="two", b=3), "invalid arguments for 'add': a:"),
    "tool-raises": (call("boom"), "ValueError: kaboom"),
    "tool-times-out": (call("hang"), "timed out after 0.1 s"),
}


@pytest.mark.parametrize(("text", "expected"), BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_goes_back_to_model(env: ToolEnv, text: str, expected: str) -> None:
    obs, reward, terminated, truncated, info = env.step(text)
    assert not terminated and not truncated
    assert reward == 0.0
    assert len(info["tool_errors"]) == 1 and expected in info["tool_errors"][0]
    assert [m["role"] for m in obs] == ["assistant", "tool"]
    assert obs[-1]["content"].startswith("Error:") and expected in obs[-1]["content"]
    assert env.state.tool_error_count == 1
    # the episode goes on: the model can still call a tool and then answer
    obs, _, terminated, _, info = env.step(call("add", a=2, b=3))
    assert obs[-1]["content"] == "5" and info["tool_errors"] == [] and not terminated
    _, reward, terminated, _, info = env.step("It is 5.")
    assert terminated and reward == 1.0 and info["final_reward"] == 1.0


def test_a_malformed_call_ends_the_episode_only_when_asked() -> None:
    """``malformed_call_ends_episode``: a turn of unparseable calls is the last, scored as is;
    a turn with a call that parses, and every other mistake, still get another turn."""
    malformed = "The answer is 5. <tool_call>{not json</tool_call>"
    env = make_env(malformed_call_ends_episode=True)
    env.reset(seed=0, options={"task": 0})
    obs, reward, terminated, truncated, info = env.step(malformed)
    assert terminated and not truncated
    assert reward == info["final_reward"] == 1.0  # the rubric scored the turn's text
    assert "malformed" in info["tool_errors"][0] and env.state.tool_error_count == 1
    assert [m["role"] for m in obs] == ["assistant", "tool"]  # the error is still on record
    other_mistakes = [text for text, _ in BAD_INPUTS.values() if "not json" not in text]
    for going_on in [call("add", a=2, b=3) + malformed, *other_mistakes]:
        env.reset(seed=0, options={"task": 0})
        _, _, terminated, truncated, info = env.step(going_on)
        assert not terminated and not truncated and info["tool_errors"], going_on
    default = make_env()
    default.reset(seed=0, options={"task": 0})
    assert not default.step(malformed)[2]  # off by default: the error and another turn


@pytest.mark.parametrize(("cap", "runs"), [(None, 40), (16, 16), (3, 3)])
def test_calls_past_the_per_turn_cap_are_not_run(cap: int | None, runs: int) -> None:
    """A turn's calls run at once: a policy could flood a sandbox pool or a service (and have
    its overload end the episode as ``infra_error``). Calls past the cap get an error each,
    so every call still has its tool message, and the episode goes on."""
    started: list[int] = []

    @tool
    def note(i: int) -> int:
        """Record a call."""
        started.append(i)
        return i

    kwargs = {} if cap == 16 else {"max_tool_calls_per_turn": cap}  # 16: the default
    env = ToolEnv([note], tasks=TASKS, **kwargs)
    env.reset(seed=0, options={"task": 0})
    turn = HERMES.render("", [ToolCall("note", {"i": i}) for i in range(40)])
    obs, _, terminated, _, info = env.step(turn)
    assert sorted(started) == list(range(runs)) and not terminated
    tool_messages = obs[1:]
    assert [m["content"] for m in tool_messages[:runs]] == [str(i) for i in range(runs)]
    assert len(tool_messages) == 40 and len(info["tool_errors"]) == 40 - runs
    assert all(f"at most {cap} run per turn" in m["content"] for m in tool_messages[runs:])
    assert env.state.tool_call_count == 40 and env.state.tool_error_count == 40 - runs


@pytest.mark.parametrize(("cap", "shown"), [(None, 100_000), (32_768, 32_768), (10, 10)])
def test_a_long_tool_result_is_cut_and_says_so(cap: int | None, shown: int) -> None:
    """A tool message is tokenized into the next prompt: a model that prints in a loop (a
    megabyte from a sandbox) stalled the engine's tokenizer and overflowed any context."""

    @tool
    def dump(n: int) -> str:
        """Return n characters."""
        return "x" * n

    kwargs = {} if cap == 32_768 else {"max_tool_result_chars": cap}  # 32,768: the default
    env = ToolEnv([dump], tasks=TASKS, **kwargs)
    env.reset(seed=0, options={"task": 0})
    obs, _, terminated, _, info = env.step(HERMES.render("", [ToolCall("dump", {"n": 100_000})]))
    content = obs[-1]["content"]
    assert content.startswith("x" * shown) and content.count("x") == shown
    if cap is not None:
        assert content.endswith(f"\n[cut: the result has 100,000 characters; the first "
                                f"{cap:,} are shown]")  # fmt: skip
    assert not terminated and not info["tool_errors"]  # a result, not an error
    cut = int(cap is not None)  # counted, so a run's metrics and health can say so
    assert info["tool_results_cut"] == env.state.turns[-1].tool_results_cut == cut
    env.reset(seed=0, options={"task": 0})
    obs, _, _, _, info = env.step(HERMES.render("", [ToolCall("dump", {"n": 10})]))
    assert obs[-1]["content"] == "x" * 10  # at the cap: untouched
    assert info["tool_results_cut"] == 0


def test_a_forfeit_ends_the_episode_after_its_turn_with_reward_0_unscored() -> None:
    """A call that destroyed what the episode is scored on (`Forfeit`): the model reads the
    message, the rest of the turn's calls run, the episode ends, and the rubric, which would
    read a world the model did not leave, is not run."""
    scored: list[str] = []

    def always_pays(completion: str) -> float:
        scored.append(completion)
        return 1.0

    @tool
    def wreck() -> str:
        """Break the world."""
        raise Forfeit("the world is gone")

    env = ToolEnv([wreck, add], tasks=TASKS, rubric=Rubric([always_pays]))
    env.reset(seed=0, options={"task": 0})
    obs, reward, terminated, truncated, info = env.step(call("wreck") + call("add", a=2, b=3))
    assert terminated and not truncated and reward == 0.0 and not scored
    assert [m["content"] for m in obs[1:]] == ["Error: the world is gone", "5"]
    assert info["forfeit"] == "wreck: the world is gone"
    assert info["scores"] == {"always_pays": 0.0}  # counted in its mean, as a 0
    [t] = rollout(lambda: ToolEnv([wreck], tasks=TASKS, rubric=Rubric([always_pays])),
                  ScriptedPolicy([call("wreck"), "never played"]), tasks=[0])  # fmt: skip
    assert t.status == "ok" and t.final_reward == 0.0 and len(t.turns) == 1
    assert t.info["forfeit"] == "wreck: the world is gone" and not scored


def test_unknown_tool_message_lists_available_tools(env: ToolEnv) -> None:
    obs, *_ = env.step(call("subtract"))
    assert "available tools: add, boom, hang, whoami, infra" in obs[-1]["content"]


@pytest.mark.parametrize(("text", "expected"), BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_recorded_in_trajectory(text: str, expected: str) -> None:
    policy = ScriptedPolicy([text, "The answer is 5."])
    [trajectory] = rollout(make_env, policy, tasks=[0])
    assert trajectory.status == "ok", trajectory.error
    assert len(trajectory.turns) == 2
    assert len(trajectory.turns[0].tool_errors) == 1
    assert expected in trajectory.turns[0].tool_errors[0]
    assert trajectory.turns[1].tool_errors == []
    assert trajectory.final_reward == 1.0
    tool_messages = [m for m in trajectory.messages if m["role"] == "tool"]
    assert len(tool_messages) == 1 and expected in tool_messages[0]["content"]


class Opaque:
    """An object without a ``__repr__``: its only text is its memory address."""


@dataclasses.dataclass
class Point:
    x: int
    y: int


def giving(value: Any) -> ToolEnv:
    """An env whose one tool, ``give``, returns ``value``; reset."""

    def give() -> Any:
        """Return the value."""
        return value

    env = ToolEnv([tool(give)], tasks=TASKS)
    env.reset(seed=0)
    return env


@pytest.mark.parametrize(
    ("value", "expected"),
    [(Opaque(), "returned a Opaque,"), ({"rows": [Opaque()]}, "returned data holding a Opaque,"),
     (says_answer, "returned a function,")],
    ids=["object", "nested", "function"],
)  # fmt: skip
def test_a_result_whose_text_is_a_memory_address_is_the_tools_error(
    value: Any, expected: str
) -> None:
    obs, _, terminated, _, info = giving(value).step(call("give"))
    [error] = info["tool_errors"]
    assert error.startswith(f"'give' {expected} which is not JSON data")
    assert "return a str or JSON data" in error
    assert obs[-1]["content"] == f"Error: {error}"  # the model reads why, not an address
    assert " at 0x" not in obs[-1]["content"] and not terminated


class Unit(enum.Enum):
    C = "celsius"


@pytest.mark.parametrize(
    ("value", "text"),
    [(Point(1, 2), '{"x": 1, "y": 2}'), ({"unit": Unit.C}, '{"unit": "celsius"}')],
    ids=["dataclass", "enum"],
)
def test_a_dataclass_or_enum_result_reaches_the_model_as_the_json_its_schema_reads(
    value: Any, text: str
) -> None:
    """An enum showed as ``Unit.C`` where the schema and the model say "celsius", and a
    dataclass as its repr where a pydantic model is JSON."""
    obs, *_, info = giving(value).step(call("give"))
    assert obs[-1]["content"] == text and info["tool_errors"] == []


@pytest.mark.parametrize(
    ("value", "text"),
    [(date(2020, 1, 2), '"2020-01-02"'), ({3}, '"{3}"')],
    ids=["date", "set"],
)
def test_a_result_json_cannot_carry_still_reaches_the_model_as_its_str(
    value: Any, text: str
) -> None:
    obs, *_, info = giving(value).step(call("give"))
    assert obs[-1]["content"] == text and info["tool_errors"] == []


def test_infra_error_from_tool_propagates(env: ToolEnv) -> None:
    with pytest.raises(SandboxError, match="container died"):
        env.step(call("infra"))
    [trajectory] = rollout(make_env, ScriptedPolicy([call("infra")]), tasks=[0])
    assert trajectory.status == "infra_error"
    assert "SandboxError: container died" in trajectory.error


def test_observations_add_up_to_messages() -> None:
    env = make_env()
    obs, info = env.reset(seed=1, options={"task": 1})
    assert info["task_index"] == 1
    for action in [call("add", a=4, b=4), "<tool_call>oops</tool_call>", "8"]:
        new, *_ = env.step(action)
        obs += new
    assert obs == env.messages
    roles = [m["role"] for m in obs]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]


def test_observations_are_copies(env: ToolEnv) -> None:
    before = json.dumps(env.messages)
    obs, *_ = env.step(call("add", a=1, b=1))
    obs[0]["content"] = "tampered"
    obs[0]["tool_calls"][0]["function"]["name"] = "tampered"
    obs.append({"role": "user", "content": "extra"})
    assert "tampered" not in json.dumps(env.messages)
    assert len(env.messages) == len(json.loads(before)) + 2


def test_reset_observation_and_info_are_copies() -> None:
    env = make_env()
    obs, info = env.reset(options={"task": 0})
    obs[1]["content"] = "tampered"
    info["task"]["answer"] = "tampered"
    assert env.messages[1]["content"] == TASKS[0]["prompt"]
    assert env.state.task["answer"] == "5" and TASKS[0]["answer"] == "5"


def test_injected_task_and_state_reach_tools(env: ToolEnv) -> None:
    obs, *_ = env.step(call("whoami"))
    assert obs[-1]["content"] == "5@1"


def test_max_turns_truncates_with_final_reward() -> None:
    env = make_env(max_turns=2)
    env.reset(options={"task": 0})
    *_, terminated, truncated, info = env.step(call("add", a=2, b=3))
    assert not terminated and not truncated and "final_reward" not in info
    _, reward, terminated, truncated, info = env.step(call("add", a=2, b=3))
    assert truncated and not terminated
    assert info["final_reward"] == 0.0 and info["scores"] == {"says_answer": 0.0}
    with pytest.raises(ConfigError, match="reset"):
        env.step("more")


def test_episode_token_budget_with_completions() -> None:
    env = make_env(max_episode_tokens=5)
    env.reset(options={"task": 0})
    turn = Completion(text=call("add", a=2, b=3), completion_ids=[1, 2, 3])
    *_, terminated, truncated, _ = env.step(turn)
    assert not terminated and not truncated and env.state.completion_tokens == 3
    *_, terminated, truncated, info = env.step(turn)
    assert truncated and not terminated and "final_reward" in info


def test_raw_text_actions_do_not_spend_token_budget() -> None:
    env = make_env(max_episode_tokens=1)
    env.reset(options={"task": 0})
    *_, truncated, _ = env.step(call("add", a=2, b=3))
    assert not truncated and env.state.completion_tokens == 0


def test_info_keeps_step_and_final_reward_apart() -> None:
    env = make_env()
    env.step_reward = lambda state, new_messages: 0.25  # type: ignore[method-assign]
    env.reset(options={"task": 0})
    _, reward, *_, info = env.step(call("add", a=2, b=3))
    assert reward == info["step_reward"] == 0.25 and "final_reward" not in info
    _, reward, terminated, _, info = env.step("5")
    assert terminated and info["step_reward"] == 0.25 and info["final_reward"] == 1.0
    assert reward == 1.25  # Gymnasium's reward: the step's and the final one


def test_env_records_the_actions_it_was_given() -> None:
    env = make_env()
    env.reset(options={"task": 0})
    env.step(Completion(text=call("add", a=2, b=3), prompt_ids=[9], completion_ids=[1, 2]))
    env.step("<tool_call>oops</tool_call>")
    first, second = env.as_trajectory().turns
    assert (first.prompt_ids, first.completion_ids, first.completion_mask) == ([9], [1, 2], [1, 1])
    assert first.tool_errors == [] and len(second.tool_errors) == 1
    assert second.text == "<tool_call>oops</tool_call>" and second.completion_ids is None
    assert env.state.tool_call_count == 1 and env.state.tool_error_count == 1


def test_custom_stop_condition_terminates() -> None:
    env = make_env(stop_conditions=[lambda state, messages: state.tool_call_count >= 2])
    env.reset(options={"task": 0})
    assert env.step(call("add", a=1, b=1))[2] is False
    _, _, terminated, truncated, info = env.step(call("add", a=2, b=3))
    assert terminated and not truncated and "final_reward" in info


@pytest.mark.parametrize(
    "options",
    [{"task": 2}, {"task": -1}, {"task": "0"}, {"task": 0.0}, {"bogus": 1}],
)
def test_bad_reset_options_raise(options: dict) -> None:
    with pytest.raises(ConfigError):
        make_env().reset(options=options)


def test_task_option_index_and_dict() -> None:
    env = make_env()
    _, info = env.reset(options={"task": 1})
    assert info == {"task_index": 1, "task": TASKS[1]}
    custom = {"prompt": "What is 1 + 1?", "answer": "2"}
    obs, info = env.reset(options={"task": custom})
    assert info == {"task_index": None, "task": custom}
    assert obs[-1] == {"role": "user", "content": "What is 1 + 1?"}


def test_env_without_tasks_needs_task_option() -> None:
    env = ToolEnv([add])
    with pytest.raises(ConfigError, match="no tasks"):
        env.reset()
    obs, _ = env.reset(options={"task": {"prompt": "hi"}})
    assert obs[-1]["content"] == "hi"


def test_a_task_without_a_prompt_names_its_keys_and_the_rename() -> None:
    env = ToolEnv([add], tasks=[{"question": "What is 2 + 3?"}])
    with pytest.raises(ConfigError, match=r"no 'prompt' \(its keys: \['question'\]\).*fields="):
        env.reset()  # was a bare KeyError: 'prompt'


def test_one_tool_instead_of_a_list_is_named() -> None:
    for one in (add, add.fn):
        with pytest.raises(ConfigError, match=r"a list of tools, e.g. \[add\]"):
            ToolEnv(one, tasks=TASKS)  # type: ignore[arg-type]


def test_step_before_reset_raises() -> None:
    with pytest.raises(ConfigError, match="reset"):
        make_env().step("hello")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_turns": 0},
        {"max_episode_tokens": 0},
        {"parser": "nope"},
        {"tools": [add, add]},
        {"max_tool_calls_per_turn": 0},
        {"max_tool_calls_per_turn": 2.5},
        {"max_tool_result_chars": 0},
        {"max_tool_result_chars": "1k"},
    ],
)
def test_bad_constructor_options_raise(kwargs: dict) -> None:
    tools = kwargs.pop("tools", [add])
    with pytest.raises(ConfigError):
        ToolEnv(tools, **kwargs)


def test_parsed_assistant_dict_with_json_string_arguments(env: ToolEnv) -> None:
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "abc", "type": "function",
             "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}},
        ],
    }  # fmt: skip
    obs, _, terminated, _, info = env.step(message)
    assert not terminated and info["tool_errors"] == []
    assert obs[-1] == {"role": "tool", "tool_call_id": "abc", "name": "add", "content": "3"}


def test_parsed_assistant_dict_with_malformed_arguments(env: ToolEnv) -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "x", "function": {"name": "add", "arguments": "{a: 1"}}],
    }
    obs, _, terminated, truncated, info = env.step(message)
    assert not terminated and not truncated
    assert (
        len(info["tool_errors"]) == 1 and "malformed arguments for 'add'" in info["tool_errors"][0]
    )
    assert obs[-1]["role"] == "tool" and obs[-1]["content"].startswith("Error:")


def test_unsupported_action_type_raises(env: ToolEnv) -> None:
    with pytest.raises(ConfigError, match="action"):
        env.step(42)


def _ran_tool(state: Any) -> float:
    return float(state.tool_call_count > 0)


async def _async_answer(completion: str, answer: str) -> float:
    await asyncio.sleep(0)
    return float(answer in completion)


def _broken_reward(completion: str) -> float:
    raise RuntimeError("reward bug")


def test_rubric_weights_metrics_and_async() -> None:
    rubric = Rubric([says_answer, _async_answer, _ran_tool], weights=[2.0, 0.5, 0.0])
    env = make_env(rubric=rubric)
    env.reset(options={"task": 0})
    env.step(call("add", a=2, b=3))
    _, reward, terminated, _, info = env.step("5")
    assert terminated
    assert info["scores"] == {"says_answer": 1.0, "_async_answer": 1.0, "_ran_tool": 1.0}
    assert info["final_reward"] == reward == 2.5  # the weight-0 metric is logged, not added
    assert info["reward_errors"] == {}


def test_raising_reward_function_is_recorded() -> None:
    env = make_env(rubric=Rubric([says_answer, _broken_reward]))
    env.reset(options={"task": 0})
    *_, info = env.step("5")
    assert info["scores"] == {"says_answer": 1.0, "_broken_reward": None}
    assert "RuntimeError: reward bug" in info["reward_errors"]["_broken_reward"]
    [trajectory] = rollout(
        lambda: make_env(rubric=Rubric([says_answer, _broken_reward])),
        ScriptedPolicy(["5"]),
        tasks=[0],
    )
    assert trajectory.status == "error"
    assert "Traceback" in trajectory.error and "RuntimeError: reward bug" in trajectory.error
    assert trajectory.scores["_broken_reward"] is None


@pytest.mark.parametrize(
    ("funcs", "weights"), [([says_answer], [1.0, 2.0]), ([lambda nope: 0.0], None)]
)
def test_bad_rubric_raises(funcs: list, weights: list | None) -> None:
    with pytest.raises(ConfigError):
        Rubric(funcs, weights)


class Shade(enum.Enum):
    DARK = "dark"
    LIGHT = "light"


def test_tool_timeout_override_keeps_everything_else_of_the_tool():
    @tool(timeout=30.0)
    def paint(shade: Shade) -> str:
        """Paint.

        Args:
            shade: which shade.
        """
        return type(shade).__name__

    env = ToolEnv([paint], tasks=TASKS, tool_timeout=2.0)
    assert env.tools["paint"].timeout == 2.0
    env.reset(seed=0)
    new_messages, *_ = env.step(call("paint", shade="dark"))
    assert new_messages[1]["content"] == "Shade"  # the Enum member still arrives, not "dark"


def test_trajectory_is_built_only_for_reward_functions_that_ask_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[int] = []
    original = ToolEnv.as_trajectory

    def counting(self: ToolEnv) -> Any:
        built.append(1)
        return original(self)

    monkeypatch.setattr(ToolEnv, "as_trajectory", counting)

    def turns(trajectory: Any) -> float:
        return float(len(trajectory.turns))

    def exact(completion: str, answer: str) -> float:
        return float(completion == answer)

    for rubric, builds, reward in [(Rubric([exact]), 0, 1.0), (Rubric([exact, turns]), 1, 3.0)]:
        built.clear()
        env = ToolEnv([add], tasks=TASKS, rubric=rubric)
        env.reset(options={"task": 0})
        env.step(call("add", a=2, b=3))
        *_, info = env.step("5")
        assert info["final_reward"] == reward  # `turns` saw both turns
        assert len(built) == builds


@pytest.mark.parametrize(
    ("reply", "runs"),
    [
        (f"<think>I could {call('add', a=2, b=2)} but I know it.</think>\n\nIt is 4.", False),
        (f"I know it, {call('add', a=2, b=2)}</think>\n\nIt is 4.", False),  # opened in prompt
        (f"<think>Use the tool.</think>\n\n{call('add', a=2, b=2)}", True),
        (f"First: <think>x</think> {call('add', a=2, b=2)}", True),  # no opening block
        (f"<think>{call('add', a=1, b=1)}?</think>\n{call('add', a=2, b=2)}", True),
    ],
)
def test_a_call_written_while_reasoning_is_not_run(env: ToolEnv, reply: str, runs: bool) -> None:
    # vLLM's server, with a reasoning parser, drops such a call: running it would train a
    # habit that does nothing once the model is deployed
    messages, _, terminated, _, _ = env.step(reply)
    assert (messages[-1]["role"] == "tool") is runs
    assert terminated is not runs
    assert [m["content"] for m in messages if m["role"] == "tool"] == (["4"] if runs else [])
    if not runs:
        assert messages[0]["content"] == reply.strip()  # the reply is kept whole
