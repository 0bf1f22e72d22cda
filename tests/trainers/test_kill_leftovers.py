"""`kill -9` of a training run at the moments a kill is likeliest to hurt, then `--resume`.

`test_grpo.py` kills a run once its checkpoint is whole; a real kill lands anywhere. A chaos
probe (some ten kills of the quickstart made tiny, at moments read off the run folder: during
the warm start, mid-checkpoint, right after a metrics line, mid-eval, mid-sync, in the final
eval and report) found every step once, no eval episode doubled, the data order and the warm
start's weights of a run never killed, and three leftovers or refusals, each kept here: the
warm start's spent checkpoint (``sft.partial/``, the model and its optimiser state) stayed
beside ``sft/`` for good when the kill came between the two; a kill in the middle of a write
left its temp file for good; and ``summary.json`` was not written whole, so a kill in the
middle of it left a file every ``--resume`` refused ("cannot be read as JSON"). The engine
case, the moment a kill costs most (a step's line and eval episodes written, its checkpoint
not), is `test_grpo.py`'s kill test.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from agentgym.runs._folder import SFT_SUMMARY, sft_checkpoint
from agentgym.trainers._run_dir import RunDir, read_jsonl_records

#: What `RunDir` needs of a config to open and reopen a run folder.
CONFIG = {"max_steps": 3, "seed": 0}
ROOT = Path(__file__).resolve().parents[2]


def killed_run(run: Path, then: str) -> subprocess.CompletedProcess[str]:
    """A process that opens ``run``, writes steps 1 to 3, then runs ``then`` and dies in it.

    A child process of its own, so its end is a real one: no ``finally`` or ``atexit`` runs.
    """
    code = f"""
import os, signal
from pathlib import Path
from agentgym.trainers._run_dir import RunDir
from agentgym.trainers._report import write_summary
from tests.trainers.killing import die_at_writes_past
run = RunDir(Path({str(run)!r}), {CONFIG!r})
for step in (1, 2, 3):
    run.write_metrics(step, {{"reward/mean": step / 4, "time/rollout": 1.0}})
run.write_metrics(3, {{"final/success": 0.5}})
{then}
"""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_a_kill_while_the_summary_is_written_leaves_a_run_that_resumes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    died = killed_run(run, "die_at_writes_past(256)\nwrite_summary(run.path, {'x/success': 0.5})")
    assert died.returncode == -signal.SIGXFSZ, died.stderr  # it died in the middle of the write
    summary = run / "summary.json"
    # whole or absent: a cut-short one refused every resume ("cannot be read as JSON")
    assert not summary.exists() or isinstance(json.loads(summary.read_text()), dict)
    assert RunDir.finished_figures(run, 3, CONFIG) is None  # not finished: it resumes
    reopened = RunDir(run, CONFIG, resume=True)
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []  # no temp file left
    assert reopened.resume_step is None  # no checkpoint: steps 1 to 3 are replayed, kept aside
    rolled_back = read_jsonl_records(run / "metrics.rolled_back.jsonl")
    assert [r["step"] for r in rolled_back] == [1, 2, 3, 3]


def test_a_killed_runs_summary_is_not_read_on_resume(tmp_path: Path) -> None:
    """A summary.json that an older agentgym's kill cut short: the resume writes it again."""
    run = tmp_path / "run"
    assert killed_run(run, "os.kill(os.getpid(), signal.SIGKILL)").returncode == -signal.SIGKILL
    (run / "summary.json").write_text('{"figures": {"grpo/suc')
    assert RunDir.finished_figures(run, 3, CONFIG) is None


def test_a_spent_warm_start_checkpoint_a_kill_left_is_removed_on_resume(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A kill after the warm start's save, before its checkpoint's removal, left both for good."""
    run = tmp_path / "run"
    assert killed_run(run, "os.kill(os.getpid(), signal.SIGKILL)").returncode == -signal.SIGKILL
    shutil.copytree(tiny_model_dir, run / "sft")  # a finished warm start: a whole model folder
    (run / "sft" / SFT_SUMMARY).write_text("{}")
    spent = sft_checkpoint(run / "sft")
    spent.parent.mkdir()
    spent.write_bytes(b"the trained weights and their optimiser state")
    RunDir(run, CONFIG, resume=True)
    assert not spent.parent.exists()
    assert (run / "sft" / SFT_SUMMARY).is_file()  # the warm start itself is kept, and reused
