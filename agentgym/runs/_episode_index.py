"""The trajectory index: a trajectories JSONL file's episodes, summarised and filtered.

Why here and not in the dashboard: ``agentgym runs episodes`` reads episodes in a terminal
with the same rows and filters as the dashboard's viewer, on a base install without FastAPI.
The index reads each complete line once (byte offset + a small summary), never holds the
whole file, and counts lines that are not trajectories instead of dropping them silently.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._trajectory import Trajectory
from ._folder import run_file

#: Trajectory files a run folder may hold, first found wins (trainer eval, then ``agentgym eval``).
TRAJECTORY_FILES = ("eval_trajectories.jsonl", "trajectories.jsonl")


def trajectories_in(run_dir: Path) -> Path | None:
    """The run folder's trajectories JSONL (see `TRAJECTORY_FILES`), or None when none yet."""
    return next((p for name in TRAJECTORY_FILES if (p := run_file(run_dir, name))), None)


#: First user message shown in the list, cut to this many characters.
_PREVIEW_CHARS = 160
#: A JSONL line longer than this is not parsed: a trajectory counts as a bad line, a metrics
#: line is skipped (a runaway writer must not make one request load gigabytes).
MAX_LINE_BYTES = 64 << 20

#: What a malformed line can raise while it is read as a trajectory or shown in detail.
MALFORMED = (ValueError, TypeError, KeyError, AttributeError, RecursionError)


@dataclass(frozen=True)
class Row:
    """One trajectory line as the list shows and filters it (no messages, no tokens)."""

    index: int
    offset: int
    step: int | None
    env_id: str
    task_index: int | None
    group_index: int
    status: str
    reward: float
    scores: dict[str, float | None]
    turns: int
    tool_calls: int
    tool_errors: int
    results_cut: int
    turns_cut: int
    length: int
    preview: str

    def summary(self) -> dict[str, Any]:
        """The JSON the list endpoint returns for this row."""
        return {k: v for k, v in self.__dict__.items() if k != "offset"}


@dataclass
class TrajectoryIndex:
    """Byte offsets and summaries of a trajectories JSONL file's complete lines.

    ``end`` is the offset after the last complete line (a torn last line written by a killed
    process is not indexed until its newline arrives); ``bad_lines`` counts lines that are
    not trajectories (shown, never silently dropped).
    """

    path: Path
    inode: int = 0
    size: int = 0
    mtime_ns: int = 0
    end: int = 0
    rows: list[Row] = field(default_factory=list)
    bad_lines: int = 0
    _fences: tuple[float, float] | None = None

    def extend(self) -> None:
        """Index the complete lines after ``end`` (the file only grew since)."""
        with self.path.open("rb") as f:
            f.seek(self.end)
            offset = self.end
            for size, line in complete_lines(f, MAX_LINE_BYTES):
                row = _row(len(self.rows), offset, line) if line is not None else None
                if row is None:
                    self.bad_lines += line is None or line.strip() != b""
                else:
                    self.rows.append(row)
                offset += size
        self.end = offset
        self._fences = None

    def length_fences(self) -> tuple[float, float]:
        """Tukey's fences on completion length: outside them is an outlier."""
        if self._fences is None:
            lengths = [r.length for r in self.rows]
            if len(lengths) < 2:
                self._fences = (-math.inf, math.inf)
            else:
                q1, _, q3 = statistics.quantiles(lengths, n=4)
                self._fences = (q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1))
        return self._fences


def complete_lines(f: Any, limit: int) -> Iterator[tuple[int, bytes | None]]:
    """(bytes taken, the line or None when over ``limit``) for each complete line from here.

    Stops before a last line without its newline (still being written); an overlong line is
    skipped in chunks, never held whole.
    """
    while True:
        line = f.readline(limit + 1)
        if line.endswith(b"\n"):
            yield len(line), line
            continue
        if len(line) <= limit:  # end of file, maybe after a torn last line
            return
        size = len(line)
        while not line.endswith(b"\n"):
            line = f.readline(1 << 20)
            if not line:
                return
            size += len(line)
        yield size, None


def _row(index: int, offset: int, line: bytes) -> Row | None:
    """Summarise one JSONL line; None when it is not a trajectory (any field of a wrong type)."""
    try:
        return _summarise(index, offset, Trajectory.from_dict(json.loads(line)))
    except MALFORMED:
        return None


def _summarise(index: int, offset: int, t: Trajectory) -> Row:
    first_user = next((m for m in t.messages if m.get("role") == "user"), {})
    return Row(
        index=index,
        offset=offset,
        step=t.info.get("step"),
        env_id=t.env_id,
        task_index=t.task_index,
        group_index=t.group_index,
        status=t.status,
        reward=finite(t.total_reward),
        scores={k: finite(v) if v is not None else None for k, v in t.scores.items()},
        turns=len(t.turns),
        tool_calls=sum(len(m.get("tool_calls") or []) for m in t.messages),
        tool_errors=sum(len(turn.tool_errors) for turn in t.turns),
        results_cut=sum(turn.tool_results_cut for turn in t.turns),
        turns_cut=sum(turn.finish_reason == "length" for turn in t.turns),
        length=sum(len(turn.completion_ids or []) for turn in t.turns),
        preview=str(first_user.get("content") or "")[:_PREVIEW_CHARS],
    )


@dataclass(frozen=True)
class TrajectoryFilter:
    """Which rows the list shows; every given condition must hold (the flags by keyword)."""

    min_reward: float | None = None
    max_reward: float | None = None
    statuses: tuple[str, ...] = ()
    tool_errors: bool = False
    length_outliers: bool = False
    step: int | None = None
    #: Only episodes with a tool result cut at ``max_tool_result_chars`` (the model read less
    #: than the tool said: the ``tool-results-cut`` finding's episodes).
    results_cut: bool = False
    #: Only episodes with a turn cut at the token limit (the ``turns-cut`` finding's: when
    #: every turn is cut, no length is an outlier).
    turns_cut: bool = False

    def predicate(self, index: TrajectoryIndex) -> Callable[[Row], bool]:
        """A test for rows of ``index`` (length outliers are relative to the whole file)."""
        low, high = index.length_fences() if self.length_outliers else (-math.inf, math.inf)

        def keep(row: Row) -> bool:
            return (
                (self.min_reward is None or row.reward >= self.min_reward)
                and (self.max_reward is None or row.reward <= self.max_reward)
                and (not self.statuses or row.status in self.statuses)
                and (not self.tool_errors or row.tool_errors > 0)
                and (not self.length_outliers or not low <= row.length <= high)
                and (self.step is None or row.step == self.step)
                and (not self.results_cut or row.results_cut > 0)
                and (not self.turns_cut or row.turns_cut > 0)
            )

        return keep


def read_line(index: TrajectoryIndex, row: Row) -> Trajectory:
    """The full trajectory of ``row``, read by seeking to its offset."""
    with index.path.open("rb") as f:
        f.seek(row.offset)
        return Trajectory.from_dict(json.loads(f.readline()))


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None, recursively (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
