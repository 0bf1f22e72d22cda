"""Search backends: where `agentgym/Search-v0` looks things up, behind one small protocol.

A backend answers two questions, ``search(query, k) -> list[Hit]`` and ``open(doc_id) ->
Doc``, and reports failures in two kinds, because the rollout must tell them apart: an id
nobody has is the model's mistake (`ValueError`: the model reads it as a tool error), while a
backend that is down, slow or malformed is infrastructure (`InfraError`: the episode is
``infra_error``, never a reward of 0). A request the service refuses as malformed or too large
(400, 413, 414, 422) is the model's too: a model must never be able to turn its own failure
into an unscored episode. So is any other failure of a request the model shaped (a 5xx, a hang,
a redirect, a dropped connection) while the service still answers a plain query: only a
service that fails that probe too is infrastructure.

Two backends ship: `BM25Backend`, an in-memory bm25s index built from any JSONL file, local
`datasets` data or a list of records (cached per process, envs are made per episode), and
`HTTPBackend`, a client of a search service speaking this REST contract::

    GET {base}/search?q=<query>&k=<k>  -> 200 {"hits": [{"id", "title", "snippet", "score"}]}
    GET {base}/docs/{id}                -> 200 {"id", "title", "text"}; 404 when no such doc

(``id`` is URL-quoted in the path; ``title``, ``snippet`` and ``score`` may be omitted.)
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable
from urllib.parse import quote

from agentgym import ConfigError, InfraError
from agentgym import _service_faults as faults
from agentgym._tasks import TaskSource, load_tasks

DEFAULT_FIELDS = {"id": "id", "title": "title", "text": "text"}
"""Which record column holds each part of a document."""

MODEL_MISTAKES = frozenset({400, 413, 414, 422})
"""Statuses that refuse what the model asked (a malformed or oversized query or id): tool
errors the model reads, never `InfraError` (a model must not turn its own failure into an
unscored episode). Every other status but 200 (and a 404 from ``/docs``) fails the request, an
`InfraError` only when the service fails a plain query too (`HTTPBackend._blamed`)."""

PROBE_QUERY = "search"
"""A plain query any search service answers: `HTTPBackend` asks it to tell a service that
failed on the model's request from one that is down (`agentgym._service_faults`)."""

T = TypeVar("T")


@dataclass(frozen=True)
class Hit:
    """One search result: which document, a short excerpt, and the backend's score."""

    id: str
    title: str
    snippet: str
    score: float = 0.0


@dataclass(frozen=True)
class Doc:
    """One document as `open` returns it."""

    id: str
    title: str
    text: str


@runtime_checkable
class SearchBackend(Protocol):
    """What `SearchEnv` needs of a search engine.

    Both methods are called from worker threads, several at once. An unknown ``doc_id``
    raises `ValueError` (the model sees the message); a failure of the backend itself raises
    `agentgym.InfraError`.
    """

    def search(self, query: str, k: int) -> list[Hit]:
        """The best ``k`` hits for ``query``, best first (fewer when fewer match)."""
        ...

    def open(self, doc_id: str) -> Doc:
        """The document ``doc_id``, as a hit named it."""
        ...


def unknown_doc(doc_id: str) -> ValueError:
    """The model's mistake of opening an id no hit gave."""
    return ValueError(f"no document with id {doc_id!r}; open an id that search returned")


class BM25Backend:
    """Okapi BM25 (bm25s, English stopwords) over ``title`` + ``text`` of documents in memory.

    Args:
        docs: the corpus; ids must be unique.
        snippet_chars: characters of a document's text shown with each hit.
    """

    def __init__(self, docs: Sequence[Doc], snippet_chars: int = 200) -> None:
        try:
            import bm25s
        except ImportError as exc:
            raise ConfigError(
                "the BM25 search backend needs bm25s: pip install 'agentgym[tools]'"
            ) from exc
        if not docs:
            raise ConfigError("the search corpus is empty; give it at least one document")
        self.docs = {d.id: d for d in docs}
        if len(self.docs) != len(docs):
            counts = Counter(d.id for d in docs)
            twice = sorted(i for i, n in counts.items() if n > 1)
            raise ConfigError(
                f"document ids must be unique; {len(twice)} id(s) appear more than once "
                f"({twice[:5]}); fix the corpus's id column"
            )
        self._order = list(docs)
        self._bm25s = bm25s
        self.snippet_chars = snippet_chars
        tokens = bm25s.tokenize(
            [f"{d.title}\n{d.text}" for d in docs], stopwords="en", show_progress=False
        )
        if not tokens.vocab:  # bm25s fails on an empty vocabulary (max() of nothing)
            raise ConfigError(
                "the search corpus has no word to index (every document's title and text are "
                "empty, stopwords or one-letter words); check the text column (fields=)"
            )
        self._index = bm25s.BM25()
        self._index.index(tokens, show_progress=False)

    def search(self, query: str, k: int) -> list[Hit]:
        """The best ``k`` documents sharing a word with ``query``."""
        words = self._bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)
        if not words[0]:
            return []
        k = min(k, len(self._order))
        found, scores = self._index.retrieve(words, k=k, show_progress=False, n_threads=1)
        docs = [(self._order[int(i)], float(s)) for i, s in zip(found[0], scores[0]) if s > 0]
        return [Hit(d.id, d.title, d.text[: self.snippet_chars], score) for d, score in docs]

    def open(self, doc_id: str) -> Doc:
        """The document ``doc_id``; `ValueError` when there is none."""
        doc = self.docs.get(doc_id)
        if doc is None:
            raise unknown_doc(doc_id)
        return doc


def docs_from_records(
    records: Sequence[Mapping[str, Any]], fields: Mapping[str, str] | None = None
) -> list[Doc]:
    """`Doc`s from records; ``fields`` maps ``id``/``title``/``text`` to column names.

    A record without the title column gets an empty title; without the id or text column it
    is a `ConfigError` naming the column and the ``fields`` knob.
    """
    columns = {**DEFAULT_FIELDS, **(fields or {})}
    unknown = sorted(set(columns) - set(DEFAULT_FIELDS))
    if unknown:
        raise ConfigError(f"fields takes the keys id, title and text, got {unknown}")
    docs = []
    for i, record in enumerate(records):
        for part in ("id", "text"):
            if record.get(columns[part]) is None:
                raise ConfigError(
                    f"corpus record {i} has no {columns[part]!r} column for the document "
                    f"{part}; name its column with fields={{'{part}': '...'}}"
                )
        title = record.get(columns["title"])
        docs.append(Doc(str(record[columns["id"]]), str(title or ""), str(record[columns["text"]])))
    if fields and "title" in fields and records:
        if not any(columns["title"] in record for record in records):
            raise ConfigError(
                f"fields names {columns['title']!r} as the title column, but no corpus record "
                f"has it (columns: {sorted({k for r in records for k in r})})"
            )
    return docs


def bm25_from(source: TaskSource, fields: Mapping[str, str] | None = None) -> BM25Backend:
    """A BM25 index over a corpus file, `datasets` folder or list of records.

    A file or folder is indexed once per process (and again when its modification time or
    size changes); a list is indexed on each call.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source).resolve()
        if not path.exists():
            raise ConfigError(f"no corpus file or folder at {str(path)!r}")
        stat = path.stat()
        columns = tuple(sorted((fields or {}).items()))
        return _cached_bm25(str(path), columns, stat.st_mtime_ns, stat.st_size)
    return BM25Backend(docs_from_records(_records(source), fields))


@functools.lru_cache(maxsize=8)
def _cached_bm25(path: str, fields: tuple[tuple[str, str], ...], *_stat: int) -> BM25Backend:
    return BM25Backend(docs_from_records(_records(path), dict(fields)))


def _records(source: TaskSource) -> list[dict[str, Any]]:
    """The corpus's records, read like tasks; a reading error names the ``corpus`` option.

    Why: the reader is the tasks' (`load_tasks`), so a broken corpus file was reported as
    "cannot read tasks from ...", sending the user to fix their tasks.
    """
    try:
        return load_tasks(source)
    except ConfigError as exc:
        raise ConfigError(f"corpus= cannot be read: {exc}") from None


class HTTPBackend:
    """A search service speaking the module's REST contract, through one pooled httpx client.

    Args:
        base_url: where the service lives, e.g. ``http://127.0.0.1:8000``.
        timeout: seconds per request; a slower answer fails the request. Keep it plus
            `PROBE_TRIES` x `PROBE_TIMEOUT` (`agentgym._service_faults`) below the tools' own
            timeout (30 s), so that a hung service is infrastructure, not the model's; busy
            answers add up to 3.5 s of waits (`BUSY_WAITS`) and their own replies.
        headers: sent with every request (e.g. an API key).
    """

    def __init__(
        self, base_url: str, timeout: float = 10.0, headers: Mapping[str, str] | None = None
    ) -> None:
        import httpx  # not at import time: the BM25 path never needs it

        self._httpx = httpx
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers)

    @property
    def blame_seconds(self) -> float:
        """How long a request that hangs takes to be blamed: its timeout, then the probes.

        A tool timeout shorter than this ends the call first, as the model's tool error.
        """
        return self.timeout + faults.PROBE_TRIES * min(faults.PROBE_TIMEOUT, self.timeout)

    def search(self, query: str, k: int) -> list[Hit]:
        """``GET /search?q=&k=``; a failure is the query's unless the service fails `_healthy`."""
        return self._blamed(lambda: self._search(query, k))

    def open(self, doc_id: str) -> Doc:
        """``GET /docs/{id}``; a 404 is the model's mistake (`ValueError`)."""
        if doc_id.strip(".") == "":  # "", ".", "..": the URL would leave /docs/ (dot segments)
            raise unknown_doc(doc_id)
        return self._blamed(lambda: self._open(doc_id))

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def _blamed(self, request: Callable[[], T]) -> T:
        """Run a request the model shaped; its failure is the model's while the service is up.

        Why: a query or id can break a service (a 5xx on a character it cannot handle, a
        wildcard that hangs it, a path it redirects); as an `InfraError` the episode would be
        dropped, not scored, so a model could escape a low reward by breaking the service. So
        a failure is sent once more (a passing one, e.g. a replica restarting, is nobody's;
        not a timeout, which would spend the tool's own time), and only when the service
        also fails a plain query (`_healthy`) is it infrastructure. Answers that stay `BUSY`
        always are.
        """
        try:
            return request()
        except _Busy:
            raise
        except _TimedOut as exc:
            failure: InfraError = exc
        except InfraError as exc:
            failure = exc  # reported: what the model's request did (the retry's may differ)
            try:
                return request()
            except _Busy:
                raise
            except InfraError:
                pass
        if not self._healthy():
            raise failure
        raise ValueError(
            f"the search service failed on this request ({failure}); the service itself "
            "works, so try other words or an id that search printed"
        ) from failure

    def _healthy(self) -> bool:
        """Whether the service answers a plain query (`PROBE_QUERY`) within `PROBE_TIMEOUT`.

        Asked `PROBE_TRIES` times, a busy answer not waited for (it fails the probe).
        """
        timeout = min(faults.PROBE_TIMEOUT, self.timeout)
        for _ in range(faults.PROBE_TRIES):
            try:
                self._search(PROBE_QUERY, 1, timeout=timeout, patient=False)
            except (InfraError, ValueError):
                continue
            return True
        return False

    def _search(
        self, query: str, k: int, timeout: float | None = None, patient: bool = True
    ) -> list[Hit]:
        data = self._get("/search", {"q": query, "k": k}, timeout=timeout, patient=patient)
        try:
            return [
                Hit(str(h["id"]), str(h.get("title", "")), str(h.get("snippet", "")),
                    float(h.get("score", 0.0)))
                for h in data["hits"]
            ]  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InfraError(f"{self.base_url}/search answered malformed hits: {exc!r}") from exc

    def _open(self, doc_id: str) -> Doc:
        data = self._get(f"/docs/{quote(doc_id, safe='')}", None, missing=doc_id)
        try:
            return Doc(str(data["id"]), str(data.get("title", "")), str(data["text"]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise InfraError(f"{self.base_url}/docs answered a malformed doc: {exc!r}") from exc

    def _fetch(self, path: str, params: dict[str, Any] | None, timeout: float | None) -> Any:
        """One GET; a timeout is `_TimedOut`, any other transport failure `InfraError`."""
        try:
            return self._client.get(path, params=params, timeout=timeout or self.timeout)
        except self._httpx.TimeoutException as exc:
            raise _TimedOut(f"search service {self.base_url} timed out: {exc!r}") from exc
        except self._httpx.HTTPError as exc:
            raise InfraError(f"search service {self.base_url} failed: {exc!r}") from exc

    def _get(
        self,
        path: str,
        params: dict[str, Any] | None,
        missing: str | None = None,
        timeout: float | None = None,
        patient: bool = True,
    ) -> Any:
        """GET ``path``; ``patient``: a busy answer is asked again (`BUSY_WAITS`)."""
        response = self._fetch(path, params, timeout)
        for wait in faults.BUSY_WAITS if patient else ():
            if not faults.ask_again(response.status_code, safe=True):  # a GET
                break
            time.sleep(wait)
            response = self._fetch(path, params, timeout)
        if response.status_code == 404 and missing is not None:
            raise unknown_doc(missing)
        if response.status_code in MODEL_MISTAKES:
            raise ValueError(
                f"the search service refused this request ({response.status_code}): "
                f"{response.text[:200]}"
            )
        if response.status_code != 200:
            failed = _Busy if response.status_code in faults.BUSY else InfraError
            raise failed(
                f"search service {self.base_url} answered {response.status_code} for {path}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise InfraError(f"search service {self.base_url} answered non-JSON: {exc}") from exc


class _Busy(InfraError):
    """The service said it is overloaded or down (`agentgym._service_faults.BUSY`)."""


class _TimedOut(InfraError):
    """The service did not answer in time."""


@functools.lru_cache(maxsize=8)
def http_backend(base_url: str) -> HTTPBackend:
    """The process's client of the service at ``base_url`` (one connection pool per URL)."""
    return HTTPBackend(base_url)


def backend_for(corpus: Any, fields: Mapping[str, str] | None = None) -> SearchBackend:
    """The backend a ``corpus`` option names: a `SearchBackend`, an http(s) URL, or a corpus."""
    is_url = isinstance(corpus, str) and corpus.startswith(("http://", "https://"))
    if fields and (is_url or isinstance(corpus, SearchBackend)):
        raise ConfigError("fields= names a corpus's columns; drop it for a service or backend")
    if isinstance(corpus, SearchBackend):
        return corpus
    return http_backend(corpus) if is_url else bm25_from(corpus, fields)
