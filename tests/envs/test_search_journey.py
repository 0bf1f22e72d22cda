"""A new user's journey through the Search env: options, own data, and what earns reward.

Each test pins a defect the journey found: options the registry could not type-check
(``num_tasks=abc`` was a raw TypeError, ``split_seed=abc`` a silent seed), ``fields`` that
was ignored or crashed, a corpus file's error that blamed the tasks, answers no reply could
ever match, built-in questions that held their own answer (reward without searching) or
that a wrong function's name also matched, and a tool timeout that blamed a hung service on
the model. One pins what the docs now say about
``open``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import agentgym
from agentgym import ConfigError
from agentgym.envs.search import HTTPBackend, exact_match, matches
from agentgym.envs.search.tasks import make_tasks, qa_corpus
from tests.conftest import hermes_call as call
from tests.conftest import require

CORPUS = [
    {"id": "a", "title": "Lima", "text": "Lima is the capital of Peru."},
    {"id": "b", "title": "Paris", "text": "Paris is the capital of France."},
]
QUESTIONS = [{"question": "Of which country is Lima the capital?", "answer": "Peru", "doc_id": "a"}]


@pytest.fixture(autouse=True)
def _bm25s() -> None:
    require("bm25s")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("option", "value"),
    [("num_tasks", "abc"), ("max_doc_chars", "abc"), ("split_seed", "abc"), ("split_seed", 1.5)],
)
def test_an_option_that_is_no_whole_number_is_a_one_line_config_error(option, value):
    # Before: num_tasks / max_doc_chars raised TypeError from a comparison; split_seed was used
    # (the registry skipped every option of a constructor with one string-alias annotation).
    with pytest.raises(ConfigError, match=re.escape(f"option {option}={value!r} is not valid")):
        agentgym.make("search", **{option: value})


def test_fields_without_a_corpus_is_refused_not_ignored():
    with pytest.raises(ConfigError, match="the built-in corpus has none: drop fields="):
        agentgym.make("search", fields={"text": "body"})


@pytest.mark.parametrize("fields", ["text", {"text": 3}])
def test_fields_that_name_no_columns_are_a_config_error(tmp_path: Path, fields):
    # Before: the string reached the indexing code and failed there with an AttributeError.
    corpus = write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    with pytest.raises(ConfigError, match=re.escape(f"option fields={fields!r} is not valid")):
        agentgym.make("search", corpus=str(corpus), tasks=QUESTIONS, fields=fields)


def test_an_unreadable_corpus_file_is_named_as_the_corpus(tmp_path: Path):
    # Before: "cannot read tasks from ...corpus.txt", sending the user to their tasks.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Lima is the capital of Peru.\n")
    with pytest.raises(ConfigError, match=r"^corpus= cannot be read: .*corpus\.txt"):
        agentgym.make("search", corpus=str(corpus), tasks=QUESTIONS)


@pytest.mark.parametrize("answer", ["", "  ", "Peru\nRepublic of Peru", ["Peru", ""]])
def test_an_answer_no_final_answer_could_match_is_refused(tmp_path: Path, answer):
    # Before: accepted; the task was unwinnable (its own reference scored 0) with nothing said.
    corpus = write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    tasks = [{**QUESTIONS[0], "answer": answer}]
    with pytest.raises(ConfigError, match="search task 0: the answer .* can never be matched"):
        agentgym.make("search", corpus=str(corpus), tasks=tasks)


def test_no_builtin_question_is_answered_by_copying_one_of_its_words():
    # Before: 100 of 184 "first parameter" questions (and a few others) named their answer,
    # e.g. "... the number of items in obj." -> obj: reward with no search at all.
    tasks = make_tasks()
    for task in tasks:
        words = set(re.findall(r"[\w.-]+", task["question"])) | set(task["question"].split())
        assert not any(exact_match(f"Answer: {w}", task["answer"]) for w in words), task
    assert {t["kind"] for t in tasks} == {"name", "parameter", "default"}  # each kind still asked


def test_open_reads_any_id_the_corpus_holds_without_a_search_first():
    env = agentgym.make("search", num_tasks=1)
    env.reset(options={"task": 0})
    new_messages, _, terminated, _, _ = env.step(call("open", doc_id="math.atan"))
    assert not terminated
    assert new_messages[-1]["content"].startswith("math.atan\n\nmath.atan(x, /)")


@pytest.mark.parametrize(("backend_timeout", "tool_timeout"), [(10.0, 15.0), (25.0, None)])
def test_a_tool_timeout_shorter_than_the_services_blame_is_refused(backend_timeout, tool_timeout):
    # Before: accepted; a hung service hit the tool's timeout before its probe, so the outage
    # was the model's tool error, scored 0 instead of infra_error.
    backend = HTTPBackend("http://127.0.0.1:9", timeout=backend_timeout)
    options = {} if tool_timeout is None else {"tool_timeout": tool_timeout}
    with pytest.raises(ConfigError, match="before a hung service is blamed"):
        agentgym.make("search", corpus=backend, tasks=QUESTIONS, **options)
    env = agentgym.make("search", corpus=backend, tasks=QUESTIONS, tool_timeout=60)
    assert env.backend is backend
    backend.close()


def test_no_other_documents_name_scores_on_a_which_function_question():
    # Before: "Answer: random.Random" (a class) scored 1 on the question about random.random,
    # as did re.Match / re.match and two more pairs: normalisation drops case and "_".
    names = [doc.id for doc in qa_corpus()]
    for task in make_tasks():
        if task["kind"] == "name":
            wrong = [n for n in names if n != task["answer"] and matches(n, task["answer"])]
            assert wrong == [], task
