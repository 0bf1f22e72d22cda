"""DocSearch: find a standard-library function from its description with search and read tools.

The search family's smallest member: the corpus is the docstrings of ~30 standard-library
modules (shipped with Python, no download), indexed in-process with BM25. The model gets the
first sentence of a docstring and must name the function; two tools (`search`, `read`) make it
a multi-step, multi-tool episode. Tasks depend on the Python version's docstrings, so they are
deterministic per interpreter version.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from agentgym import Rubric, ToolCall, ToolEnv, tool
from agentgym._tasks import check_num_tasks

MODULES = (
    "base64", "binascii", "bisect", "calendar", "collections", "copy", "datetime", "difflib",
    "fnmatch", "functools", "glob", "hashlib", "heapq", "html", "itertools", "json", "keyword",
    "math", "operator", "os.path", "random", "re", "secrets", "shutil", "statistics", "string",
    "textwrap", "urllib.parse", "uuid", "zlib",
)  # fmt: skip
_WORD = re.compile(r"\w+")
_NAME = re.compile(r"[A-Za-z_][\w.]*\w")


@dataclass(frozen=True)
class Doc:
    """One searchable document: a function's qualified name, summary and docstring."""

    name: str
    summary: str
    text: str


@functools.cache
def corpus() -> tuple[Doc, ...]:
    """Public functions of `MODULES` whose first docstring paragraph is unique and informative."""
    docs = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name, obj in sorted(vars(module).items()):
            doc = inspect.getdoc(obj) if callable(obj) and not name.startswith("_") else None
            home = getattr(obj, "__module__", None) in (module_name, module.__name__)
            if doc and (home or inspect.isbuiltin(obj)):
                summary = " ".join(doc.split("\n\n")[0].split())
                docs.append(Doc(f"{module_name}.{name}", summary, doc[:2000]))
    counts = Counter(d.summary for d in docs)
    return tuple(d for d in docs if counts[d.summary] == 1 and len(d.summary) > 25)


class BM25:
    """Okapi BM25 over `Doc.text` (k1=1.5, b=0.75): small enough to read, fast enough here."""

    def __init__(self, docs: tuple[Doc, ...], k1: float = 1.5, b: float = 0.75) -> None:
        self.docs, self.k1, self.b = docs, k1, b
        self.terms = [Counter(_WORD.findall(d.text.lower())) for d in docs]
        self.lengths = [sum(t.values()) for t in self.terms]
        self.avg_length = sum(self.lengths) / len(self.lengths)
        df = Counter(word for t in self.terms for word in t)
        n = len(docs)
        self.idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in df.items()}

    def search(self, query: str, k: int) -> list[Doc]:
        """The ``k`` best documents for ``query``, best first."""
        words = _WORD.findall(query.lower())
        scored = []
        for i, terms in enumerate(self.terms):
            norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg_length)
            score = sum(
                self.idf.get(w, 0.0) * terms[w] * (self.k1 + 1) / (terms[w] + norm)
                for w in words
                if w in terms
            )
            scored.append((score, i))
        scored.sort(key=lambda s: (-s[0], s[1]))
        return [self.docs[i] for score, i in scored[:k] if score > 0]


@functools.cache
def index() -> BM25:
    """The process-wide index (built on first use, ~0.1 s)."""
    return BM25(corpus())


@tool(timeout=10.0)
def search(query: str, k: int = 5) -> str:
    """Search the Python standard-library docs; returns one `name: summary` line per hit.

    Args:
        query: words to look for.
        k: how many results, 1 to 10.
    """
    if not 1 <= k <= 10:
        raise ValueError(f"k must be between 1 and 10, got {k}")
    # JSON Schema counts 3.0 as an integer, so it passes validation; as a slice bound it raised
    # a TypeError the model could not make sense of.
    hits = index().search(query, int(k))
    return "\n".join(f"{d.name}: {d.summary[:120]}" for d in hits) or "no results"


@tool(timeout=10.0)
def read(name: str) -> str:
    """Read the whole docstring of a function found by search.

    Args:
        name: its full name as search printed it, e.g. "math.gcd".
    """
    doc = next((d for d in corpus() if d.name == name), None)
    if doc is None:
        raise ValueError(f"no document named {shorten(name)!r}; use a name that search returned")
    return doc.text


def shorten(text: str, limit: int = 100) -> str:
    """``text`` cut to ``limit`` characters for an error message.

    Why: the error quotes the name the model sent, so a 100,000-character name came back whole
    and doubled what it cost the conversation; no real name is longer than ~40 characters.
    """
    return text if len(text) <= limit else text[:limit] + "..."


def make_tasks(num_tasks: int | None, seed: int) -> list[dict[str, Any]]:
    """Questions over the corpus in a seeded order; None means every document."""
    docs = list(corpus())
    random.Random(seed).shuffle(docs)
    return [
        {
            "prompt": f'Which Python standard-library function is documented as: "{d.summary}"? '
            "Answer with its full name, e.g. math.sqrt.",
            "answer": d.name,
            "summary": d.summary,
        }
        for d in docs[:num_tasks]
    ]


def named_functions(text: str) -> set[str]:
    """The distinct candidate answers ``text`` names: dotted names of a function of `MODULES`.

    A whole dotted name whose module part is one of `MODULES` (``math.gcd``,
    ``os.path.join``), whether or not that function exists; other words and dotted names
    (``e.g``, ``os.path``, ``numpy.mean``) are not candidates.
    """
    return {n for n in _NAME.findall(text or "") if n.rpartition(".")[0] in MODULES}


def names_the_function(completion: str, answer: str) -> float:
    """1 if the final reply names the function exactly, and names no other candidate.

    A reply that hedges (lists several functions, or every name search returned) scores 0,
    even when the answer is among them; naming the answer twice is fine.
    """
    return float(named_functions(completion) == {answer})


def searched(state: Any) -> float:
    """Metric only (weight 0): did the episode call a tool."""
    return float(state.tool_call_count > 0)


class DocSearchEnv(ToolEnv):
    """Name the standard-library function a docstring sentence describes, using search/read.

    Args:
        num_tasks: how many questions (None: one per document, ~300).
        seed: order of the questions.
        kwargs: any `ToolEnv` option (``parser``, ``max_turns`` ...).
    """

    def __init__(self, num_tasks: int | None = None, seed: int = 0, **kwargs: Any) -> None:
        check_num_tasks(num_tasks, none_ok=True)
        kwargs.setdefault("max_turns", 6)
        kwargs.setdefault(
            "system_prompt",
            "You answer questions about Python's standard library. Use search to find "
            "candidates and read to check one, then reply with the function's full name.",
        )
        super().__init__(
            [search, read],
            tasks=make_tasks(num_tasks, seed),
            rubric=Rubric([names_the_function, searched], weights=[1.0, 0.0]),
            **kwargs,
        )

    def reference_turns(self, task: dict[str, Any]) -> list[str]:
        query = ToolCall("search", {"query": task["summary"], "k": 3})
        return [self.parser.render("", [query]), f"It is {task['answer']}."]
