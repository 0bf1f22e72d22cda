"""The built-in QA set: questions about standard-library functions, answered from their docs.

It needs no download and is deterministic per Python version: the corpus is DocSearch's
(`agentgym.envs.docsearch.corpus`: public functions of ~30 standard-library modules with a
unique docstring summary), each document being a function's signature and docstring. Each
question names a function only by its docstring summary, so the model must search for it,
and its answer is a short string written in that one document:

- ``name``: "Which function is documented as ...?" -> its dotted name (``math.gcd``);
- ``parameter``: "What is the first parameter of ...?" -> a parameter name (``iterable``);
- ``default``: "What is the default value of parameter p of ...?" -> ``70``, ``strict``.

Every task carries ``doc_id``, the document holding its answer (the oracle opens it; the
held-out split keeps a document's questions together). Left out, so that only the right
answer, found by searching, scores: a question whose summary holds its answer (`_gives_away`),
and a "which function" question whose name matches another function's once normalised
(`_clashing_names`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import random
import re
from collections import Counter
from typing import Any

from agentgym.envs import docsearch

from .backends import BM25Backend, Doc

_SIMPLE_DEFAULTS = (int, float, str)
_WORD = re.compile(r"[\w.-]+")  # keeps "re.match" and "UTF-8" whole, splits "function(item)"


@functools.cache
def _signature(name: str) -> inspect.Signature | None:
    module, _, attr = name.rpartition(".")
    try:
        return inspect.signature(getattr(importlib.import_module(module), attr))
    except (TypeError, ValueError):  # some builtins have none
        return None


@functools.cache
def qa_corpus() -> tuple[Doc, ...]:
    """One document per function: ``name(signature)`` then its docstring."""
    docs = []
    for d in docsearch.corpus():
        signature = _signature(d.name)
        head = f"{d.name}{signature}" if signature is not None else d.name
        docs.append(Doc(d.name, d.name, f"{head}\n\n{d.text}"))
    return tuple(docs)


@functools.cache
def qa_index() -> BM25Backend:
    """The process-wide BM25 index of `qa_corpus` (built on first use)."""
    return BM25Backend(qa_corpus())


def _questions(name: str, summary: str) -> list[tuple[str, str, str]]:
    """(kind, question, answer) for one function."""
    described = f'the Python standard-library function documented as "{summary}"'
    found = [("name", f"Which is {described}? Give its full dotted name.", name)]
    found += _signature_questions(described, _signature(name))
    return [q for q in found if not _gives_away(summary, q[2])]


def _signature_questions(
    described: str, signature: inspect.Signature | None
) -> list[tuple[str, str, str]]:
    """(kind, question, answer) about a function's first parameter and one default value."""
    found: list[tuple[str, str, str]] = []
    if signature is None:
        return found
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if positional and len(positional[0].name) >= 3:
        found.append(("parameter", f"What is the first parameter of {described}?",
                      positional[0].name))  # fmt: skip
    for p in params:
        value = p.default
        simple = type(value) in _SIMPLE_DEFAULTS and len(repr(value)) <= 20
        # a blank default ("", " \t") cannot be written as an answer line; negatives are left
        # out (the set predates normalisation keeping a number's minus sign)
        blank = isinstance(value, str) and not value.strip()
        if simple and not blank and not (isinstance(value, (int, float)) and value < 0):
            question = f"What is the default value of the {p.name} parameter of {described}?"
            found.append(("default", question, str(value)))
            break
    return found


def _gives_away(summary: str, answer: str) -> bool:
    """Whether a word of ``summary``, given as the final answer, would match ``answer``.

    Why: a summary often names the first parameter ("... the number of items in obj."), the
    class ("The result of re.match() ...") or the default ("... decoded with UTF-8"); such a
    question is answered by copying a word of the question, with no search at all.
    """
    from . import matches  # the package imports this module before defining matches

    words = set(_WORD.findall(summary)) | set(summary.split())
    return any(matches(word, answer) for word in words)


@functools.cache
def _clashing_names() -> frozenset[str]:
    """The corpus's dotted names that the reward cannot tell from another one's.

    Why: normalisation drops case and punctuation, so ``random.Random`` (a class) equals
    ``random.random`` (a function), and naming the wrong one scored 1 on either's question.
    """
    from . import normalize  # the package imports this module before defining normalize

    counts = Counter(normalize(d.name) for d in docsearch.corpus())
    return frozenset(d.name for d in docsearch.corpus() if counts[normalize(d.name)] > 1)


#: Questions of one kind that may share an answer: past it, one guess without a search (a
#: default of ``0``) would answer many (22 of the 53 default-value questions before the cap).
MAX_SAME_ANSWER = 3


def make_tasks(seed: int = 0) -> list[dict[str, Any]]:
    """Every question of the corpus, in an order fixed by ``seed``.

    At most `MAX_SAME_ANSWER` questions of a kind share an answer (the first in corpus order).
    """
    seen: Counter[tuple[str, str]] = Counter()
    tasks = []
    for d in docsearch.corpus():
        for kind, question, answer in _questions(d.name, d.summary):
            if kind == "name" and answer in _clashing_names():
                continue
            seen[kind, answer] += 1
            if seen[kind, answer] <= MAX_SAME_ANSWER:
                tasks.append({"question": question, "answer": answer, "doc_id": d.name,
                              "kind": kind})  # fmt: skip
    random.Random(seed).shuffle(tasks)
    return tasks
