"""Dashboard: runs table, live curves, two runs compared, and a trajectory viewer.

Why: practitioners spend most of their time reading episodes to catch reward hacking, so the
viewer must open any run instantly and let them filter for the suspicious ones (high reward
with tool errors, length outliers, odd statuses) and then see exactly what was trained: every
message, tool call and result, per-function scores and the token-level loss mask.

How it stays fast on big runs: the trajectories JSONL is indexed once per file version (byte
offset + a small summary per line, cached by inode/size/mtime; an append-only growth extends
the index instead of rebuilding it). Listing pages and filtering read only that index; a detail
reads one line by seeking to its offset. Metrics are polled by byte offset too (``since``), so
a live run sends only its new lines.

Safety: trajectories are model output. The JSON API returns them as data; the page
(``static/dashboard.js``) builds DOM nodes with ``textContent`` only, and HTML is served with a
Content-Security-Policy that forbids inline scripts, so ``<script>`` in a message stays text.

Example::

    app = FastAPI()
    app.include_router(dashboard_router(store))  # store: list_runs(limit), get_run(run_id)
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse

from .._errors import ConfigError
from .._trajectory import PrefixMismatchError, Status, Trajectory
from ..runs import TERMINAL
from ..runs._episode_index import (
    MALFORMED,
    MAX_LINE_BYTES,
    TrajectoryFilter,
    TrajectoryIndex,
    complete_lines,
    finite,
    read_line,
    trajectories_in,
)
from ..runs._folder import live_step, run_file

STATIC_DIR = Path(__file__).with_name("static")
#: Files the page loads; nothing else under ``static/`` is served.
_STATIC_TYPES = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
#: No inline script or style, no third-party origin: model output cannot run code in the page.
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
#: Most trajectory summaries one page may ask for.
MAX_PAGE = 200
#: Indexes kept in memory (least recently used dropped first).
_INDEX_CACHE_SIZE = 16
#: Most bytes of ``metrics.jsonl`` one poll reads; the next poll continues from ``next``.
MAX_METRICS_BYTES = 16 << 20


class RunStore(Protocol):
    """What the dashboard reads from the run store (`agentgym serve` passes its own)."""

    def list_runs(self, limit: int = 200) -> list[dict[str, Any]]:
        """Newest runs first: id, kind, name, status, run_dir, created_at, step, figures."""
        ...

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """One run (the `list_runs` keys plus ``config``), or None when unknown."""
        ...


# ---- trajectory index --------------------------------------------------------------------------


class IndexCache:
    """`TrajectoryIndex` per file, rebuilt only when the file was replaced or shrank."""

    def __init__(self, size: int = _INDEX_CACHE_SIZE) -> None:
        self._size = size
        self._indexes: OrderedDict[Path, TrajectoryIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path) -> TrajectoryIndex:
        """The up-to-date index of ``path`` (which must exist)."""
        stat = path.stat()
        with self._lock:
            index = self._indexes.pop(path, None)
            if index is None or index.inode != stat.st_ino or stat.st_size < index.size:
                index = TrajectoryIndex(path)  # new, replaced (atomic rename) or rolled back
            if (index.size, index.mtime_ns) != (stat.st_size, stat.st_mtime_ns):
                index.inode, index.size = stat.st_ino, stat.st_size
                index.mtime_ns = stat.st_mtime_ns
                index.extend()
            self._indexes[path] = index
            while len(self._indexes) > self._size:
                self._indexes.popitem(last=False)
            return index


def page(
    index: TrajectoryIndex, where: TrajectoryFilter, offset: int, limit: int
) -> dict[str, Any]:
    """One page of matching rows, with the counts the pager shows."""
    keep = where.predicate(index)
    matched = [r for r in index.rows if keep(r)]
    low, high = index.length_fences()
    return {
        "total": len(index.rows),
        "matched": len(matched),
        "offset": offset,
        "bad_lines": index.bad_lines,
        "length_fences": [finite(low), finite(high)],
        "items": [r.summary() for r in matched[offset : offset + limit]],
    }


# ---- metrics -----------------------------------------------------------------------------------


def read_metrics(path: Path, since: int, patterns: Iterable[str]) -> dict[str, Any]:
    """Metric points from byte ``since`` of ``metrics.jsonl`` to its last complete line.

    Each point is ``{"step", "time", "values"}`` with the finite numbers whose key matches one
    of ``patterns`` (``fnmatch``; none means all); lines with none are skipped. ``next`` is the
    offset to poll from; when the file shrank below ``since`` (a resumed run rolled lines back)
    it is read from the start and ``reset`` is true, so the page redraws instead of appending.
    """
    wanted = list(patterns)
    size = path.stat().st_size if path.is_file() else 0
    reset = since > size
    start = first = 0 if reset else since
    points: list[dict[str, Any]] = []
    if size > start:
        with path.open("rb") as f:
            f.seek(start)
            for taken, line in complete_lines(f, MAX_LINE_BYTES):
                start += taken
                point = _metric_point(line, wanted) if line is not None else None
                if point is not None and point["values"]:
                    points.append(point)
                if start - first >= MAX_METRICS_BYTES:
                    break
    return {"points": points, "next": start, "reset": reset}


def _metric_point(line: bytes, patterns: list[str]) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    step = record.get("step") if isinstance(record, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    values = {
        key: value
        for key, value in record.items()
        if key not in ("step", "time")
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (not patterns or any(fnmatch.fnmatchcase(key, p) for p in patterns))
    }
    return {"step": record["step"], "time": record.get("time"), "values": values}


# ---- tokens and the loss mask ------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _load_tokenizer(source: str) -> Any:
    """A `tokenizers.Tokenizer` from a ``tokenizer.json`` path, or from a ``tiny[:PRESET]`` name."""
    if source == "tiny" or source.startswith("tiny:"):
        from ..engine.tiny import PRESETS, make_tokenizer

        preset = PRESETS[source.partition(":")[2] or "test"]
        return make_tokenizer(
            tools_style=preset.get("tools_style", "full"), merges=preset.get("merges", 0)
        ).backend_tokenizer
    from tokenizers import Tokenizer

    return Tokenizer.from_file(source)


def tokenizer_source(run: dict[str, Any]) -> tuple[str | None, str]:
    """Where the run's tokenizer is: (source for `_load_tokenizer` or None, why / which).

    Looked for in the run folder (``tokenizer.json``, ``tokenizer/tokenizer.json``), then in the
    config's ``model`` folder; ``tiny`` models are rebuilt in memory (deterministic).
    """
    run_dir = _run_dir(run)
    config = run.get("config")
    model = str((config if isinstance(config, dict) else {}).get("model") or "")
    candidates: list[Path | None] = []
    if run_dir is not None:  # in the run folder: only files inside it (`run_file`)
        candidates += [
            run_file(run_dir, "tokenizer.json"),
            run_file(run_dir, "tokenizer/tokenizer.json"),
        ]
    if model and not model.startswith("tiny"):
        candidates.append(Path(model).expanduser() / "tokenizer.json")
    for candidate in candidates:
        if candidate is not None and candidate.is_file():
            return str(candidate), f"tokenizer {candidate}"
    if model == "tiny" or model.startswith("tiny:"):
        from ..engine.tiny import PRESETS  # a light module: torch loads only to build weights

        if model.partition(":")[2] not in ("", *PRESETS):
            return None, f"unknown tiny preset in model {model!r}: showing token ids"
        return model, f"tokenizer of {model} (rebuilt)"
    return None, "no tokenizer.json in the run folder or the model folder: showing token ids"


def token_view(trajectory: Trajectory, run: dict[str, Any]) -> dict[str, Any]:
    """The trained sequence(s) with their loss mask, decoded when the tokenizer is found.

    ``concat`` episodes are one sequence (`Trajectory.flatten`); otherwise each turn is its
    own sample (prompt tokens mask 0, completion tokens their ``completion_mask``).
    """
    try:
        ids, mask, _ = trajectory.flatten()
        mode, sequences = "concat", [{"label": "episode", "ids": ids, "mask": mask}]
    except (PrefixMismatchError, ValueError):
        mode, sequences = "per_turn", []
        for k, turn in enumerate(trajectory.turns):
            prompt, completion = turn.prompt_ids or [], turn.completion_ids or []
            turn_mask = turn.completion_mask or [1] * len(completion)
            sequences.append(
                {
                    "label": f"turn {k}",
                    "ids": prompt + completion,
                    "mask": [0] * len(prompt) + turn_mask,
                }
            )
    source, note = tokenizer_source(run)
    decoded = False
    if source is not None:
        try:
            tokenizer = _load_tokenizer(source)
            for seq in sequences:
                pieces = tokenizer.decode_batch(
                    [[i] for i in seq["ids"]], skip_special_tokens=False
                )
                seq["pieces"] = pieces
            decoded = True
        except Exception as exc:  # a broken or absent tokenizer: ids are still the truth
            note = f"cannot load the tokenizer ({type(exc).__name__}: {exc}): showing token ids"
    return {"mode": mode, "decoded": decoded, "tokenizer": note, "sequences": sequences}


# ---- JSON helpers ------------------------------------------------------------------------------


def detail(trajectory: Trajectory, index: int, run: dict[str, Any]) -> dict[str, Any]:
    """Everything the detail view shows (tokens without logprobs, which nobody reads here)."""
    turns = [
        {
            "text": t.text,
            "finish_reason": t.finish_reason,
            "reward": t.reward,
            "tool_errors": t.tool_errors,
            "tool_results_cut": t.tool_results_cut,
            "completion_tokens": t.sampled_tokens,
            "adapter_version": t.adapter_version,
        }
        for t in trajectory.turns
    ]
    data = {
        "index": index,
        "env_id": trajectory.env_id,
        "task": trajectory.task,
        "task_index": trajectory.task_index,
        "group_index": trajectory.group_index,
        "status": trajectory.status,
        "error": trajectory.error,
        "final_reward": trajectory.final_reward,
        "total_reward": trajectory.total_reward,
        "scores": trajectory.scores,
        "timings": trajectory.timings,
        "info": trajectory.info,
        "mode": trajectory.mode,
        "messages": trajectory.messages,
        "turns": turns,
        "tokens": token_view(trajectory, run),
    }
    return dict(finite(data))


def run_summary(run: dict[str, Any]) -> dict[str, Any]:
    """The runs-table fields of a store record (no config: the table does not need it)."""
    keys = ("id", "kind", "name", "status", "created_at", "step", "figures", "run_dir")
    return dict(finite({k: run.get(k) for k in keys} | {"step": live_step(run)}))


def _run_dir(run: dict[str, Any]) -> Path | None:
    """The run's folder; None for a job that has not created one yet."""
    return Path(run["run_dir"]) if run.get("run_dir") else None


def check_folder(run: dict[str, Any]) -> None:
    """404 naming the folder when a run that ran has lost its folder (deleted or moved).

    Why: without it the run's logs, curves and trajectories read as empty, as if it had
    played nothing. A queued job, or one cancelled before it started, has no folder yet.
    """
    run_dir = _run_dir(run)
    if run_dir is None or run.get("started_at") is None or run.get("status") not in TERMINAL:
        return
    if not run_dir.is_dir():
        raise HTTPException(
            404, f"run {run['id']!r} ({run['status']}) has no folder {run_dir} any more "
            f"(deleted or moved?); its row is kept: restore the folder, or read the row at "
            f"/jobs/{run['id']}",
        )  # fmt: skip


def trajectory_file(run: dict[str, Any]) -> Path | None:
    """The run's trajectories JSONL (`trajectories_in` its folder), or None when none yet."""
    run_dir = _run_dir(run)
    if run_dir is None:
        return None
    return trajectories_in(run_dir)


# ---- routes ------------------------------------------------------------------------------------


#: Per run kind, the file its health is read from (`run_findings`), and what it holds.
_HEALTH_SOURCES = {
    "train": ("metrics.jsonl", "metrics"), "eval": ("trajectories.jsonl", "episodes"),
    "sft": ("sft.json", "model"),
}  # fmt: skip


def dashboard_router(store: RunStore) -> APIRouter:
    """The dashboard's page (``/``, ``/static/...``) and its JSON API (``/api/runs/...``)."""
    router = APIRouter()
    cache = IndexCache()

    def get_run(run_id: str) -> dict[str, Any]:
        run = store.get_run(run_id)
        if run is None:
            raise HTTPException(404, f"no run {run_id!r}; list the runs at /api/runs")
        return run

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index_page() -> HTMLResponse:
        html = (STATIC_DIR / "dashboard.html").read_text(encoding="utf-8")
        return HTMLResponse(html, headers=_SECURITY_HEADERS)

    @router.get("/static/{name}", include_in_schema=False)
    def static_file(name: str) -> FileResponse:
        if name not in _STATIC_TYPES:
            raise HTTPException(404, f"no static file {name!r}")
        return FileResponse(
            STATIC_DIR / name, media_type=_STATIC_TYPES[name], headers=_SECURITY_HEADERS
        )

    @router.get("/api/runs", tags=["dashboard"])
    def list_runs(limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> dict[str, Any]:
        """Newest runs first, as the runs table shows them."""
        return {"runs": [run_summary(r) for r in store.list_runs(limit=limit)]}

    @router.get("/api/runs/{run_id}", tags=["dashboard"])
    def show_run(run_id: str) -> dict[str, Any]:
        """One run with its resolved config."""
        run = get_run(run_id)
        return {**run_summary(run), "config": finite(run.get("config") or {})}

    @router.get("/api/runs/{run_id}/metrics", tags=["dashboard"])
    def metrics(
        run_id: str,
        since: Annotated[int, Query(ge=0, description="byte offset from the last poll")] = 0,
        key: Annotated[list[str] | None, Query(description="fnmatch patterns; none = all")] = None,
    ) -> dict[str, Any]:
        """Metric points after byte ``since``; poll again from ``next``."""
        run = get_run(run_id)
        check_folder(run)
        run_dir = _run_dir(run)
        path = run_file(run_dir, "metrics.jsonl") if run_dir is not None else None
        if path is None:
            return {"points": [], "next": 0, "reset": False}
        return read_metrics(path, since, key or [])

    @router.get("/api/runs/{run_id}/health", tags=["dashboard"])
    def health(run_id: str) -> dict[str, Any]:
        """A train, eval or sft run's findings, as ``agentgym runs doctor`` prints them.

        ``why`` says why there are none to read (no metrics, episodes or model yet).
        """
        run = get_run(run_id)
        check_folder(run)
        run_dir = _run_dir(run)
        if run.get("kind") not in _HEALTH_SOURCES or run_dir is None:
            return {"findings": [], "why": f"a {run.get('kind')} run has no metrics to read"}
        name, what = _HEALTH_SOURCES[run["kind"]]
        if run_file(run_dir, name) is None:
            return {"findings": [], "why": f"no {what} yet"}
        from agentgym.trainers._report import run_findings  # torch-free, loaded on first use

        try:
            return {"findings": [f.as_dict() for f in run_findings(run_dir)], "why": None}
        except ConfigError as exc:  # a line that is not JSON: said, not a 500
            return {"findings": [], "why": str(exc)}

    @router.get("/api/runs/{run_id}/trajectories", tags=["dashboard"])
    def trajectories(
        run_id: str,
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        min_reward: float | None = None,
        max_reward: float | None = None,
        status: Annotated[list[Status] | None, Query()] = None,
        tool_errors: bool = False,
        length_outliers: bool = False,
        step: int | None = None,
        results_cut: bool = False,
        turns_cut: bool = False,
    ) -> dict[str, Any]:
        """One page of trajectory summaries matching every given filter."""
        run = get_run(run_id)
        check_folder(run)
        path = trajectory_file(run)
        if path is None:
            return {"total": 0, "matched": 0, "offset": offset, "bad_lines": 0,
                    "length_fences": [None, None], "items": []}  # fmt: skip
        where = TrajectoryFilter(
            min_reward, max_reward, tuple(status or ()), tool_errors=tool_errors,
            length_outliers=length_outliers, step=step, results_cut=results_cut,
            turns_cut=turns_cut,
        )  # fmt: skip
        return page(cache.get(path), where, offset, limit)

    @router.get("/api/runs/{run_id}/trajectories/{index}", tags=["dashboard"])
    def trajectory(run_id: str, index: Annotated[int, PathParam(ge=0)]) -> dict[str, Any]:
        """One trajectory in full: messages, tool calls and results, scores, loss mask."""
        run = get_run(run_id)
        check_folder(run)
        path = trajectory_file(run)
        found = cache.get(path) if path is not None else TrajectoryIndex(Path())
        if index >= len(found.rows):
            raise HTTPException(
                404, f"run {run_id!r} has {len(found.rows)} trajectories; there is no #{index}"
            )
        try:
            return detail(read_line(found, found.rows[index]), index, run)
        except MALFORMED as exc:  # indexed, yet a field the detail reads has the wrong type
            raise HTTPException(
                422,
                f"trajectory #{index} of run {run_id!r} is malformed ({type(exc).__name__}: "
                f"{exc}); the list shows its summary",
            ) from None

    return router


__all__ = ["RunStore", "dashboard_router"]
