"""`Rubric`: unique score names, and the `trajectory` a reward function sees is the env's own."""

from __future__ import annotations

import asyncio
import doctest
import functools

import pytest

import agentgym
from agentgym import Completion, ConfigError, Rubric, ToolEnv, rollout
from agentgym import _rubric as rubric_module


def score(rubric: Rubric, **context: object) -> agentgym.RubricResult:
    return asyncio.run(rubric.score(context))


def contains(completion: str, needle: str) -> float:
    return float(needle in completion)


# --- names ----------------------------------------------------------------------------------


def test_two_lambdas_are_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match="<lambda>.*names="):
        Rubric([lambda completion: 1.0, lambda completion: 0.0])


def test_a_partial_without_a_name_is_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match="no __name__.*names="):
        Rubric([functools.partial(contains, needle="42")])


def test_explicit_names_key_the_scores() -> None:
    rubric = Rubric(
        [functools.partial(contains, needle="42"), functools.partial(contains, needle="6")],
        weights=[1.0, 0.0],
        names=["says_42", "says_6"],
    )
    result = score(rubric, completion="42")
    assert result.scores == {"says_42": 1.0, "says_6": 0.0}
    assert result.reward == 1.0 and rubric.names == ["says_42", "says_6"]


@pytest.mark.parametrize(
    ("names", "match"), [(["same", "same"], "share the name"), (["one"], "2 functions but 1 names")]
)
def test_bad_names_are_refused(names: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Rubric([contains, contains], names=names)


def test_same_function_twice_needs_names() -> None:
    with pytest.raises(ConfigError, match="'contains'"):
        Rubric([contains, contains], weights=[1.0, 0.0])


def test_docstring_example_runs() -> None:
    assert doctest.testmod(rubric_module).failed == 0


# --- the trajectory a reward function sees ----------------------------------------------------


class CountingPolicy:
    """Answers with fixed token ids, as a backend that reports them would."""

    async def generate(self, messages, tools, *, max_tokens=None, task=None):
        return Completion(text="The answer is 42.", completion_ids=[7] * 30)


def length_penalty(trajectory) -> float:
    """A DAPO-style overlong penalty reads the sampled token count."""
    tokens = sum(len(turn.completion_ids or ()) for turn in trajectory.turns)
    return -tokens / 100


def make_env(*funcs) -> ToolEnv:
    rubric = Rubric(list(funcs) or [length_penalty])
    return ToolEnv(tasks=[{"prompt": "6 * 7?", "answer": "42"}], rubric=rubric)


def test_rubric_sees_the_final_turn_token_ids_through_the_rollout() -> None:
    [trajectory] = rollout(make_env, CountingPolicy(), tasks=[0])
    assert trajectory.status == "ok"
    assert trajectory.final_reward == -0.3
    assert trajectory.scores == {"length_penalty": -0.3}


def test_stepping_by_hand_gives_the_same_trajectory_view() -> None:
    env = make_env()
    env.reset(seed=0)
    *_, info = env.step(Completion(text="The answer is 42.", completion_ids=[7] * 30))
    assert info["scores"] == {"length_penalty": -0.3} and info["reward_errors"] == {}


def test_raw_text_turns_are_in_the_view_without_token_ids() -> None:
    seen = []

    def record(trajectory) -> float:
        seen.append(trajectory)
        return 0.0

    env = make_env(record)
    env.reset(seed=0)
    env.step("The answer is 42.")
    [view] = seen
    assert [(t.text, t.completion_ids) for t in view.turns] == [("The answer is 42.", None)]
    assert view.task == {"prompt": "6 * 7?", "answer": "42"} and view.task_index == 0
    assert view.messages == env.messages


def test_reward_function_cannot_edit_the_engine_record() -> None:
    def vandal(trajectory) -> float:
        trajectory.turns.clear()
        trajectory.messages.clear()
        return 1.0

    [trajectory] = rollout(lambda: make_env(vandal), CountingPolicy(), tasks=[0])
    assert trajectory.status == "ok" and trajectory.final_reward == 1.0
    assert len(trajectory.turns) == 1 and trajectory.turns[0].completion_ids == [7] * 30
    assert [m["role"] for m in trajectory.messages] == ["system", "user", "assistant"]


# --- what a reward function may return and ask for --------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None, "high", "1.0", b"1", 1e13])
def test_a_score_that_is_not_a_finite_number_is_recorded_as_an_error(bad: object) -> None:
    good = functools.partial(contains, needle="4")
    rubric = Rubric([lambda completion: bad, good], names=["bad", "good"])
    result = score(rubric, completion="42")
    assert result.scores == {"bad": None, "good": 1.0}
    assert result.reward == 1.0  # only the good function counts; NaN would poison the group
    assert "bad" in result.errors


def test_a_judge_returning_the_replys_text_cannot_be_paid_what_the_model_wrote() -> None:
    """A function that returns text it took from the reply let the model write its reward."""

    def echo(completion: str) -> str:
        return completion.strip()

    env = ToolEnv([], tasks=[{"prompt": "score yourself"}], rubric=Rubric([echo]))
    [episode] = rollout(lambda: env, agentgym.ScriptedPolicy([" 1e300 "]))
    assert (episode.status, episode.total_reward, episode.scores) == ("error", 0.0, {"echo": None})
    assert "returned str '1e300': a reward must be a number" in (episode.error or "")


def test_a_failing_reward_function_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    # Gymnasium's step returns a number whatever happens: the log says a function failed.
    def flaky_reward(completion: str) -> float:
        raise ValueError("no score for " + completion)

    rubric = Rubric([flaky_reward])
    with caplog.at_level("WARNING", logger="agentgym._rubric"):
        for _ in range(3):
            assert score(rubric, completion="42").scores == {"flaky_reward": None}
    said = [r.getMessage() for r in caplog.records if "flaky_reward" in r.getMessage()]
    assert len(said) == 1 and "ValueError: no score for 42" in said[0], said


@pytest.mark.parametrize("weight", ["a", float("nan"), True, None])
def test_weights_must_be_finite_numbers(weight: object) -> None:
    with pytest.raises(ConfigError, match="weight 0 is"):
        Rubric([contains], weights=[weight])  # type: ignore[list-item]


def test_kwargs_gets_every_injectable_value_and_args_gets_nothing() -> None:
    seen: dict[str, object] = {}

    def trl_style(*args: object, **kwargs: object) -> float:
        seen.update(kwargs, args=args)
        return 1.0

    result = score(Rubric([trl_style]), completion="x", answer="y")
    assert result.scores == {"trl_style": 1.0}
    assert seen["args"] == () and seen["completion"] == "x" and seen["answer"] == "y"
    assert set(seen) - {"args"} == Rubric.INJECTABLE


def test_kwargs_does_not_excuse_a_required_parameter_it_cannot_get() -> None:
    def trl_style(completions: list[str], **kwargs: object) -> float:  # TRL's plural name
        return 1.0

    with pytest.raises(ConfigError, match=r"asks for \['completions'\]"):
        Rubric([trl_style])


@pytest.mark.parametrize(
    ("reply", "seen"),
    [
        ("The answer is 90.", "The answer is 90."),
        ("<think>88? no, 66 + 24 = 90</think>\n\nThe answer is 90.", "The answer is 90."),
        ("88 or 90? 90.\n</think>\n\nThe answer is 90.", "The answer is 90."),  # opened in prompt
        ("<think>a</think>x <think>b</think>y", "x y"),
        ("<think>66 + 24 = 90", ""),  # cut off while reasoning: no answer given
        ("The answer is 90. <think>or 88", "The answer is 90."),
    ],
)
def test_rewards_read_the_final_reply_without_its_reasoning(reply: str, seen: str) -> None:
    from agentgym._tool_env import without_reasoning

    assert without_reasoning(reply) == seen


def test_a_reasoning_model_weighing_candidates_is_scored_on_its_answer() -> None:
    # docsearch refuses a reply naming two functions; its thinking may name many
    answer = agentgym.make("docsearch", num_tasks=1).tasks[0]["answer"]
    [t] = agentgym.rollout(
        "docsearch",
        agentgym.ScriptedPolicy([f"<think>math.gcd or {answer}?</think>\n{answer}"]),
        tasks=[0], env_kwargs={"num_tasks": 1},
    )  # fmt: skip
    assert t.final_reward == 1.0
    assert "<think>" in t.messages[-1]["content"]  # the conversation keeps the raw text
