"""Reward attacks a reward-seeking policy would try on calculator, docsearch and search.

Each test plays the attack as a scripted policy (or scores its final reply) and checks that it
earns nothing, while the honest, right answer written in any reasonable form still scores 1.
"""

from __future__ import annotations

import pytest

import agentgym
from agentgym.envs.calculator import correct_answer
from agentgym.envs.docsearch import corpus, names_the_function
from agentgym.envs.search import exact_match, final_answer, normalize, token_f1
from tests.conftest import hermes_call as call
from tests.conftest import require


def play(env_id: str, turns, task: int = 0, **env_kwargs) -> agentgym.Trajectory:
    [trajectory] = agentgym.rollout(
        env_id, agentgym.ScriptedPolicy(turns), tasks=[task], env_kwargs=env_kwargs
    )
    return trajectory


# --- calculator ------------------------------------------------------------------------------


def test_calculator_right_answer_in_any_usual_notation_scores_one():
    # "1,776" used to score 0 (its last number was 776), "1776.0" and "−56" too
    for reply, answer in [("1,776", "1776"), ("It is 1776.0.", "1776"), ("−56", "-56"),
                          ("The answer is 1776.", "1776"), ("-56", "-56")]:  # fmt: skip
        assert correct_answer(reply, answer) == 1.0, reply


def test_calculator_reply_commits_to_its_last_number():
    assert correct_answer("1776 or maybe 1777", "1776") == 0.0
    assert correct_answer("It is 1777, no, 1776", "1776") == 1.0
    assert correct_answer("56", "-56") == 0.0 and correct_answer("-56", "56") == 0.0
    assert correct_answer("1.776e3", "1776") == 0.0  # no exponents: its last number is 3
    assert correct_answer("12,34 then 1,7765", "7765") == 1.0  # bad groups are two numbers
    assert correct_answer("1776 (found in 2 steps)", "1776") == 0.0


def test_calculator_answer_only_in_a_tool_call_or_a_huge_reply_scores_zero_without_error():
    env = agentgym.make("calculator")
    task = env.tasks[0]
    truncated = play("calculator", [call("calculate", expression=task["answer"])] * 4)
    assert truncated.status == "truncated" and truncated.final_reward == 0.0
    huge = play("calculator", ["9" * 100_000])  # past int()'s 4300-digit limit: still scored
    assert huge.status == "ok" and huge.final_reward == 0.0


def test_calculator_tool_failures_are_tool_errors_never_infra_errors():
    # division by zero, a power (not allowed), 201 characters (over the 200 limit)
    expressions = ["1/0", "2**99999", "(" * 100 + "1" + ")" * 100]
    turns = [call("calculate", expression=e) for e in expressions] + ["0"]
    trajectory = play("calculator", turns)
    assert trajectory.status == "ok" and trajectory.final_reward == 0.0
    assert all(t.tool_errors for t in trajectory.turns[:3])


def test_calculator_reference_still_scores_one_and_estimates_mostly_zero():
    env = agentgym.make("calculator", num_tasks=100)
    assert all(correct_answer(env.reference_turns(t)[-1], t["answer"]) for t in env.tasks)
    assert sum(correct_answer(env.estimate_turns(t)[-1], t["answer"]) for t in env.tasks) < 10


# --- docsearch -------------------------------------------------------------------------------


def test_docsearch_reply_listing_every_name_scores_zero():
    names = [d.name for d in corpus()]
    assert names_the_function(" ".join(names), names[0]) == 0.0
    assert names_the_function("It is math.gcd or math.lcm.", "math.gcd") == 0.0


def test_docsearch_hedging_over_the_search_results_scores_zero():
    env = agentgym.make("docsearch", num_tasks=5)
    task = env.tasks[0]
    search = call("search", query=task["summary"], k=10)
    hits = agentgym.rollout(
        "docsearch", agentgym.ScriptedPolicy([search, "?"]), tasks=[0],
        env_kwargs={"num_tasks": 5},
    )[0].messages[3]["content"]  # fmt: skip
    listed = [line.split(":")[0] for line in hits.splitlines()]
    assert task["answer"] in listed and len(listed) > 1
    hedged = play("docsearch", [search, "One of: " + ", ".join(listed)], num_tasks=5)
    assert hedged.status == "ok" and hedged.final_reward == 0.0


def test_docsearch_one_committed_name_scores_one_despite_other_dotted_words():
    for reply in ["It is `math.gcd`.", "math.gcd, e.g. math.gcd(4, 6) == 2. Done.",
                  "From os.path? No: it is math.gcd"]:  # fmt: skip
        assert names_the_function(reply, "math.gcd") == 1.0, reply
    assert names_the_function("Math.GCD", "math.gcd") == 0.0
    assert names_the_function("It is math.gcd", "math.lcm") == 0.0


def test_docsearch_reference_scores_one_on_every_task():
    env = agentgym.make("docsearch")
    assert all(names_the_function(env.reference_turns(t)[-1], t["answer"]) for t in env.tasks)


# --- search ----------------------------------------------------------------------------------


@pytest.fixture
def search_env():
    require("bm25s")
    return agentgym.make("search", split="all")


def test_search_empty_answer_does_not_match_a_punctuation_gold(search_env):
    # the default "/" of urllib.parse.quote normalised to "", so an empty answer matched it
    slash = [i for i, t in enumerate(search_env.tasks) if t["answer"] == "/"]
    assert slash
    for reply in ["Answer:", "Answer: ?", "I don't know."]:
        trajectory = play("search", [reply], task=slash[0], split="all")
        assert trajectory.final_reward == 0.0, reply
    assert play("search", ["Answer: /"], task=slash[0], split="all").final_reward == 1.0
    assert exact_match("Answer: ", "") == 0.0


def test_search_numbers_compare_by_value():
    assert exact_match("Answer: 7.0", "70") == 0.0  # was 1: "7.0" and "70" both gave "70"
    assert exact_match("Answer: 1", "1.0") == 1.0 and exact_match("Answer: 0", "0.0") == 1.0
    assert exact_match("Answer: 1e-9", "1e-09") == 1.0
    assert exact_match("Answer: 1e-9", "1e9") == 0.0 and exact_match("Answer: 1", "-1") == 0.0
    assert exact_match("Answer: 70.", "70") == 1.0
    assert exact_match("Answer: 1e99999999999999999999", "70") == 0.0
    assert token_f1("Answer: 7.0", "70") == 0.0
    assert normalize("utf-8") == normalize("UTF8") and normalize("The  Seine!") == "seine"


def test_search_reply_must_commit_to_one_answer():
    assert exact_match("Answer: math.gcd or math.lcm", "math.gcd") == 0.0
    assert exact_match("Answer: math.gcd\nmath.lcm", "math.gcd") == 1.0
    assert final_answer("Answer: math.lcm\nAnswer: math.gcd") == "math.gcd"
    document = "math.gcd(*integers)\n\nGreatest Common Divisor."
    assert exact_match(f"Answer:\n{document}", "integers") == 0.0  # a dumped document


def test_search_reference_scores_one_on_every_builtin_task(search_env):
    assert all(
        exact_match(search_env.reference_turns(t)[-1], t["answer"]) for t in search_env.tasks
    )
    assert not any(exact_match("Answer:", t["answer"]) for t in search_env.tasks)


def test_search_oversized_query_or_doc_id_is_a_tool_error(search_env):
    turns = [call("search", query="word " * 2000), call("open", doc_id="x" * 10_000), "Answer: 1"]
    trajectory = play("search", turns, split="all")
    assert trajectory.status == "ok"
    assert "query longer than 2000" in trajectory.messages[3]["content"]
    assert "doc_id longer than 500" in trajectory.messages[5]["content"]
