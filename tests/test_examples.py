"""The runnable examples the README points to keep working."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_custom_env_example_registers_and_evaluates():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_env.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    summary = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 4
    assert summary["status"]["ok"] == 4
    assert summary["reward/mean"] == 1.0


def test_code_agent_example_trains_with_sandboxed_rewards_as_its_comment_says(tmp_path):
    """examples/code_agent.yaml's smoke test: HumanEval, rewards from Docker sandboxes."""
    out = tmp_path / "code-agent"
    # the step-0 and final evals on 4 held-out tasks, not all 40: 80 sandboxed episodes were
    # most of the run, and what is checked is the training step's
    subprocess.run(
        [str(Path(sys.executable).parent / "agentgym"), "train",
         str(ROOT / "examples" / "code_agent.yaml"), "--set", "max_steps=1",
         "--set", "eval_steps=null", "--set", "eval_tasks=0:4", "--set", "eval_num_tasks=null",
         "--set", f"output_dir={out}"],
        capture_output=True, text=True, timeout=600, check=True,
        env={**os.environ, "AGENTGYM_RUNS_DB": "off"},
    )  # fmt: skip
    [step] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
              if json.loads(line).get("step") == 1 and "reward/mean" in line]  # fmt: skip
    # the pool's counters run for the process: the step-0 eval's 4 episodes, then the step's 8
    assert step["sandbox/leases"] >= 4 + 8
    assert step["rollout/frac_infra_error"] == 0.0
