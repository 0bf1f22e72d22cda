"""Search: answer questions from a document collection with ``search`` and ``open`` tools.

The general search env (DocSearch is its smallest, fixed member): the documents sit behind a
`SearchBackend` (an in-memory BM25 index over any JSONL file or local `datasets` data, or a
real search service over HTTP), so the same env trains on a built-in corpus and on yours.
The built-in QA set (`tasks.make_tasks`) needs no download and has a held-out split. The
reward is SQuAD's: the short answer after ``Answer:`` in the final reply, normalised (case,
punctuation, articles, spaces; numbers by value), must equal a gold answer; token F1 is logged
beside it.
A backend failure is an `InfraError`, so the episode is ``infra_error``, never a 0.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal

from agentgym import ConfigError, Rubric, ToolCall, ToolEnv, tool
from agentgym._tasks import Split, TaskSource, check_num_tasks, load_tasks, select_split

from .backends import BM25Backend, Doc, Hit, HTTPBackend, SearchBackend, backend_for
from .tasks import make_tasks, qa_index

__all__ = ["BM25Backend", "Doc", "HTTPBackend", "Hit", "SearchBackend", "SearchEnv"]

MAX_K = 10
ANSWER_FORMAT = "End your reply with a line `Answer: <short answer>`."
MAX_QUERY_CHARS = 2000
MAX_DOC_ID_CHARS = 500
TOOL_TIMEOUT = 30.0
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# Punctuation is dropped, except what belongs to a number: a decimal point between digits, the
# minus sign starting a number and the one of an exponent, so "7.0" is not "70", nor "-1" "1".
_PUNCTUATION = re.compile(
    r"(?<=\d)\.(?=\d)|(?<![\w.])-(?=\d)|(?<=\de)-(?=\d)|([" + re.escape(string.punctuation) + "])"
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d{1,6})?")  # Decimal refuses huge exponents
_ANSWER_MARK = re.compile(r"answer\s*:", re.IGNORECASE)


@tool(timeout=TOOL_TIMEOUT)
def search(query: str, k: int = 5, *, env: Any) -> str:
    """Search the documents; returns one block per hit: `[id] title` and an excerpt.

    Args:
        query: words to look for.
        k: how many results, 1 to 10.
        env: injected (the episode's env, holding the backend); not shown to the model.
    """
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be between 1 and {MAX_K}, got {k}")
    if len(query) > MAX_QUERY_CHARS:  # the model's mistake, never the service's (HTTP 414)
        raise ValueError(f"query longer than {MAX_QUERY_CHARS} characters; use fewer words")
    k = int(k)  # JSON schema's integers include 1.0, which a service may not parse as one
    hits = env.backend.search(query, k)
    return "\n".join(f"[{h.id}] {h.title}\n  {' '.join(h.snippet.split())}" for h in hits) or (
        "no results; try other words"
    )


@tool(name="open", timeout=TOOL_TIMEOUT)
def open_doc(doc_id: str, *, env: Any) -> str:
    """Read a document found by search.

    Args:
        doc_id: its id, as search printed it in brackets.
        env: injected (the episode's env, holding the backend); not shown to the model.
    """
    if len(doc_id) > MAX_DOC_ID_CHARS:
        raise ValueError(f"doc_id longer than {MAX_DOC_ID_CHARS} characters")
    doc = env.backend.open(doc_id)
    text = doc.text[: env.max_doc_chars]
    cut = " (truncated)" if len(doc.text) > len(text) else ""
    return f"{doc.title}\n\n{text}{cut}"


def normalize(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces.

    Unlike SQuAD's, it keeps the punctuation of numbers (``7.0``, ``-1``, ``1e-09``).
    """
    kept = _PUNCTUATION.sub(lambda m: "" if m.group(1) else m.group(0), text.lower())
    return " ".join(_ARTICLES.sub(" ", kept).split())


def final_answer(completion: str) -> str:
    """The first line after the reply's last ``Answer:``; its first line when it has none."""
    marks = list(_ANSWER_MARK.finditer(completion or ""))
    rest = completion[marks[-1].end() :] if marks else (completion or "")
    lines = [line.strip() for line in rest.strip().splitlines()]
    return lines[0] if lines else ""


def _golds(answer: str | list[str]) -> list[str]:
    return [answer] if isinstance(answer, str) else list(answer)


def matches(predicted: str, gold: str) -> bool:
    """Whether the final answer ``predicted`` is the gold answer ``gold``.

    Both normalised; numbers compare by value (``1.0`` is ``1``, ``7.0`` is not ``70``). A gold
    answer that normalisation empties (``/``) must be written as is; nothing matches an
    empty one, so an empty final answer never scores.
    """
    wanted = normalize(gold)
    if not wanted:
        return bool(gold.strip()) and predicted.strip() == gold.strip()
    given = normalize(predicted)
    if _NUMBER.fullmatch(wanted) and _NUMBER.fullmatch(given):
        return Decimal(given) == Decimal(wanted)
    return given == wanted


def exact_match(completion: str, answer: str | list[str]) -> float:
    """1 if the final answer equals a gold answer after normalisation (`matches`)."""
    predicted = final_answer(completion)
    return float(any(matches(predicted, gold) for gold in _golds(answer)))


def token_f1(completion: str, answer: str | list[str]) -> float:
    """Best token-overlap F1 of the final answer against the gold answers."""
    predicted = normalize(final_answer(completion)).split()
    best = 0.0
    for gold in map(str.split, map(normalize, _golds(answer))):
        common = sum((Counter(predicted) & Counter(gold)).values())
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def searched(state: Any) -> float:
    """Metric only (weight 0): did the episode call a tool."""
    return float(state.tool_call_count > 0)


def _check_task(i: int, task: Mapping[str, Any]) -> None:
    """Refuse a task the reward cannot read, or one no final answer could ever match."""
    if "question" not in task or "answer" not in task:
        raise ConfigError(
            f"search task {i} needs 'question' (a string) and 'answer' (a string or a list of "
            f"strings), got keys {sorted(task)}; rename columns with load_tasks(fields=...)"
        )
    answer, question = task["answer"], task["question"]
    if not isinstance(question, str) or not question.strip():
        raise ConfigError(
            f"search task {i}: 'question' must be a non-empty string, got {question!r}"
        )
    golds_ok = isinstance(answer, str) or (
        isinstance(answer, list) and answer and all(isinstance(a, str) for a in answer)
    )
    if not golds_ok:
        raise ConfigError(
            f"search task {i}: 'answer' must be a string or a non-empty list of strings, got "
            f'{answer!r}; write numbers as strings ("42")'
        )
    for gold in _golds(answer):
        if len(gold.strip().splitlines()) != 1:  # `final_answer` reads one line
            raise ConfigError(
                f"search task {i}: the answer {gold[:80]!r} can never be matched, since a final "
                "answer is one non-blank line; write it on one line or drop it"
            )


def _check_blame_time(backend: SearchBackend, tool_timeout: Any) -> None:
    """Refuse a tool timeout that would end a hung service's call before it is blamed.

    Why: `HTTPBackend` blames a hung request on the service only after its own timeout and
    a probe; a tool timeout that fires first makes it the model's tool error, so an outage
    scores 0 instead of ``infra_error``.
    """
    limit = TOOL_TIMEOUT if tool_timeout is None else tool_timeout
    if not isinstance(limit, (int, float)):
        return  # not a number: `ToolEnv` refuses it
    if isinstance(backend, HTTPBackend) and backend.blame_seconds >= limit:
        raise ConfigError(
            f"the search tools time out after {limit:g} s, before a hung service is "
            f"blamed ({backend.blame_seconds:g} s: its timeout {backend.timeout:g} s, then "
            "its probes); raise tool_timeout, or give the backend a shorter timeout: "
            "corpus=HTTPBackend(url, timeout=5)"
        )


class SearchEnv(ToolEnv):
    """Answer a question by searching documents; reward = normalised exact match.

    Args:
        corpus: where documents come from. None: the built-in standard-library corpus. A
            path to a JSONL/JSON/CSV/Parquet file or a ``save_to_disk`` folder: indexed in
            memory with BM25 (once per process). An ``http(s)://`` URL: a search service
            speaking the REST contract of `backends`. Or any `SearchBackend`.
        tasks: questions, dicts with ``question``, ``answer`` (a string or a list of accepted
            strings) and optionally ``doc_id`` (the document holding the answer; the oracle
            opens it). A path, a list or a `datasets.Dataset` (see `agentgym._tasks.load_tasks`).
            None: the built-in QA set, only with the built-in corpus.
        fields: the corpus's column names, ``{"id": ..., "title": ..., "text": ...}``.
        split: ``train``, ``eval`` (held out: ``eval_fraction`` of the documents, chosen
            by ``split_seed``) or ``all``.
        eval_fraction: share held out, in [0, 1).
        split_seed: which documents are held out.
        num_tasks: keep the split's first ``num_tasks`` questions; None keeps all.
        reward: ``exact_match`` (weight 1, F1 logged) or ``f1`` (token F1 is the reward).
        max_doc_chars: characters of a document `open` shows.
        kwargs: any `ToolEnv` option (``parser``, ``max_turns`` ...).
    """

    def __init__(
        self,
        corpus: TaskSource | SearchBackend | None = None,
        tasks: TaskSource | None = None,
        *,
        fields: Mapping[str, str] | None = None,
        split: Split = "train",
        eval_fraction: float = 0.2,
        split_seed: int = 0,
        num_tasks: int | None = None,
        reward: Literal["exact_match", "f1"] = "exact_match",
        max_doc_chars: int = 4000,
        **kwargs: Any,
    ) -> None:
        if reward not in ("exact_match", "f1"):
            raise ConfigError(f"reward must be 'exact_match' or 'f1', got {reward!r}")
        check_num_tasks(num_tasks, none_ok=True)
        if max_doc_chars < 1:
            raise ConfigError(f"max_doc_chars must be >= 1, got {max_doc_chars}")
        if tasks is None and corpus is not None:
            raise ConfigError("a corpus of your own needs tasks=...: questions with answers")
        if fields is not None and corpus is None:
            raise ConfigError(
                "fields= names the columns of a corpus of your own; the built-in corpus has "
                "none: drop fields= or pass corpus="
            )
        self.backend = qa_index() if corpus is None else backend_for(corpus, fields)
        _check_blame_time(self.backend, kwargs.get("tool_timeout"))
        self.max_doc_chars = max_doc_chars
        questions = make_tasks() if tasks is None else load_tasks(tasks)
        for i, task in enumerate(questions):
            _check_task(i, task)
        # questions about one document stay on one side; tasks without doc_id: by question
        by_doc = "doc_id" if any("doc_id" in q for q in questions) else None
        chosen = select_split(questions, split, eval_fraction, split_seed, key=by_doc)
        if questions and not chosen:
            raise ConfigError(
                f"split={split!r} with eval_fraction={eval_fraction} leaves no question; raise "
                "eval_fraction or use split='all'"
            )
        kwargs.setdefault("max_turns", 6)
        kwargs.setdefault(
            "system_prompt",
            "You answer questions from a document collection. Use search to find documents "
            "and open to read one, then give the short answer.",
        )
        weights = [1.0, 0.0] if reward == "exact_match" else [0.0, 1.0]
        super().__init__(
            [search, open_doc],
            tasks=chosen[:num_tasks],
            rubric=Rubric([exact_match, token_f1, searched], weights=[*weights, 0.0]),
            **kwargs,
        )

    def build_prompt(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return super().build_prompt({"prompt": f"{task['question']}\n\n{ANSWER_FORMAT}"})

    def reference_turns(self, task: dict[str, Any]) -> list[str]:
        calls = [ToolCall("search", {"query": task["question"], "k": 3})]
        if task.get("doc_id"):
            calls.append(ToolCall("open", {"doc_id": task["doc_id"]}))
        gold = _golds(task["answer"])[0]
        return [*(self.parser.render("", [c]) for c in calls), f"Answer: {gold}"]
