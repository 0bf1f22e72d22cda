"""``agentgym eval --tasks START:END --resume`` after a kill plays each missing episode once.

Why: the resume skipped finished episodes by task index while the rollout keys them by
position in the plan; under ``--tasks 5:8`` none matched, so every episode was played again
and the file and summary counted 4 episodes of a 3-episode run (one twice).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from agentgym import read_jsonl

AGENTGYM = Path(sys.executable).parent / "agentgym"


def run(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "AGENTGYM_RUNS_DB": "off"}
    return subprocess.run(
        [str(AGENTGYM), "eval", "calculator", "--tasks", "5:8", "-g", "2", "--out", str(out),
         *args],
        cwd=out.parent, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_killed_task_range_run_resumes_to_each_episode_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = run(out)
    assert first.returncode == 0, first.stderr[-2000:]
    results = out / "trajectories.jsonl"
    whole = results.read_text().splitlines(keepends=True)
    results.write_text("".join(whole[:2]))  # killed after two episodes, before the summary
    (out / "summary.json").unlink()
    resumed = run(out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    episodes = list(read_jsonl(results))
    counts = Counter((t.task_index, t.group_index) for t in episodes)
    assert counts == Counter({(i, g): 1 for i in (5, 6, 7) for g in (0, 1)})
    assert '"episodes": 6' in (out / "summary.json").read_text()
