"""``agentgym eval --tasks START:END`` plays each task with the seeds the whole run gives it.

Why: an episode's seed followed its position in the selection, so ``--tasks 2:4 --seed 7``
played task 2 with the seed ``-n 4 --seed 7`` gives task 0: a user re-running a few tasks
to reproduce a failure got other episodes. Seeds matter here: the loopback server answers
with the seed each request carried (the per-turn seed `OpenAIPolicy` derives from the
episode's), as a sampling server's reply depends on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from agentgym import read_jsonl
from agentgym._trajectory import Trajectory
from tests.conftest import send_json, serving

AGENTGYM = Path(sys.executable).parent / "agentgym"


class _EchoSeed(BaseHTTPRequestHandler):
    """Serves model ``m``; answers each request with the seed it was sent."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        send_json(self, 200, {"data": [{"id": "m"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        message = {"role": "assistant", "content": f"seed {body['seed']}"}
        send_json(self, 200, {"choices": [{"message": message, "finish_reason": "stop"}]})

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the command's files."""


def run_eval(url: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "AGENTGYM_RUNS_DB": "off"}
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(
        [str(AGENTGYM), "eval", "calculator", "--policy", "openai", "--base-url", f"{url}/v1",
         "--model", "m", "-g", "2", "--seed", "7", "--out", str(out), *args],
        cwd=out.parent, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def evaluate(url: str, out: Path, *args: str) -> list[Trajectory]:
    proc = run_eval(url, out, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return list(read_jsonl(out / "trajectories.jsonl"))


def played(episodes: list[Trajectory]) -> dict[tuple[int | None, int], tuple]:
    """Each episode by (task, member): what it played, not where it sat in its run."""
    return {
        (t.task_index, t.group_index): (t.seed, t.task, t.messages, [x.text for x in t.turns],
                                        t.total_reward, t.status)
        for t in episodes
    }  # fmt: skip


def test_a_task_range_and_its_resume_play_the_whole_runs_episodes(tmp_path: Path) -> None:
    with serving(_EchoSeed) as url:
        whole = played(evaluate(url, tmp_path / "whole", "-n", "4"))
        part = played(evaluate(url, tmp_path / "part", "--tasks", "2:4"))
        results = tmp_path / "part" / "trajectories.jsonl"
        results.write_text("".join(results.read_text().splitlines(keepends=True)[:1]))
        (tmp_path / "part" / "summary.json").unlink()  # killed after one episode
        again = evaluate(url, tmp_path / "part", "--tasks", "2:4", "--resume")
    resumed = played(again)
    assert len(again) == 4  # each episode once
    # -n keeps the seeds it always gave (recorded results stay reproducible): 7 + 2 * task + g
    assert {key: v[0] for key, v in whole.items()} == {
        (i, g): 7 + 2 * i + g for i in range(4) for g in range(2)
    }
    assert len({v[3][0] for v in whole.values()}) == 8  # the seeds made the episodes differ
    wanted = {key: v for key, v in whole.items() if key[0] in (2, 3)}
    assert part == wanted
    assert resumed == wanted


def test_a_range_run_written_before_the_shift_is_not_resumed_with_shifted_seeds(
    tmp_path: Path,
) -> None:
    """Its ``run.json`` has no ``seed_base`` (its seeds began at ``--seed``): resumed, its
    missing episodes would play seeds shifted by START * G beside the old ones, unsaid."""
    with serving(_EchoSeed) as url:
        evaluate(url, tmp_path / "part", "--tasks", "2:4")
        run = tmp_path / "part" / "run.json"
        saved = json.loads(run.read_text())
        assert saved["seed_base"] == 7 + 2 * 2
        del saved["seed_base"]
        run.write_text(json.dumps(saved))
        (tmp_path / "part" / "summary.json").unlink()
        proc = run_eval(url, tmp_path / "part", "--tasks", "2:4", "--resume")
    assert proc.returncode != 0
    assert "settings differ" in proc.stderr and "seed_base null there, 11 now" in proc.stderr
