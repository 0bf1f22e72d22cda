"""Which file of a run folder the metrics endpoint streams, and how an eval's lines are shown."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from agentgym.runs._folder import run_file

#: Per-episode fields of an eval trajectory the metrics stream keeps (the viewer has the rest).
_EPISODE_FIELDS = ("task_index", "group_index", "final_reward", "status", "scores")


def metric_lines(
    kind: str, run_dir: str | None
) -> tuple[Callable[[], Path | None], Callable[[bytes], bytes | None] | None]:
    """The JSONL file behind a run's metrics stream, and how each line is shown.

    train: ``metrics.jsonl`` as is; eval: ``trajectories.jsonl`` cut to each episode's reward,
    status and scores (whole trajectories are the viewer's job). The file is looked up on each
    call (it may not exist yet), and only as a regular file inside the run folder (`run_file`).
    """
    if run_dir is None:
        return lambda: None, None
    if kind == "train":
        return lambda: run_file(run_dir, "metrics.jsonl"), None
    return lambda: run_file(run_dir, "trajectories.jsonl"), _episode_line


def _episode_line(line: bytes) -> bytes | None:
    try:
        episode = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(episode, dict):
        return None
    return json.dumps({k: episode.get(k) for k in _EPISODE_FIELDS}).encode()
