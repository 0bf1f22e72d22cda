"""One SIGTERM stops a command whose event loop a sync reward function holds.

Why: the CLI turns SIGTERM into Ctrl-C, which only cancels the main task when the loop next
turns; a reward function that never returned held it, so the one SIGTERM that ``docker
stop``, Slurm or a job queue sends did nothing, and their SIGKILL left the command's
processes behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentgym._stop import SIGTERM_GRACE_S

ENV_MODULE = '''
import os, pathlib, time
import agentgym

def judge(completion: str) -> float:
    pathlib.Path(os.environ["READY_FILE"]).write_text("scoring")  # the test's readiness file
    time.sleep(10**6)  # a judge's blocking call that never returns, on the event loop
    return 1.0

class StuckJudge(agentgym.ToolEnv):
    def __init__(self, **kwargs):
        super().__init__(tasks=[{"prompt": "say 1", "answer": "1"}],
                         rubric=agentgym.Rubric([judge]), **kwargs)

    def reference_turns(self, task):
        return [task["answer"]]

agentgym.register("tests/StuckJudge-v0", StuckJudge)
'''

AGENTGYM = str(Path(sys.executable).with_name("agentgym"))

#: Seconds the child gets to start (imports) and to stop after the signal's grace.
START_S, STOP_S = 60.0, 30.0


@pytest.fixture
def command(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """``agentgym eval`` of the stuck env, in a session of its own; killed if left running."""
    (tmp_path / "stuck_judge.py").write_text(ENV_MODULE)
    ready = tmp_path / "ready"
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = os.environ | {"PYTHONPATH": path, "READY_FILE": str(ready),
                        "AGENTGYM_HOME": str(tmp_path / "home")}  # fmt: skip
    child = subprocess.Popen(
        [AGENTGYM, "eval", "stuck_judge:tests/StuckJudge-v0",
         "--policy", "reference", "--out", str(tmp_path / "out")],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield child, ready
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.communicate(timeout=STOP_S)


def wait_for(path: Path, child: subprocess.Popen[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert child.poll() is None, child.communicate()[0]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_one_sigterm_stops_a_run_whose_loop_a_reward_function_holds(
    command: tuple[subprocess.Popen[str], Path],
) -> None:
    child, ready = command
    wait_for(ready, child, START_S)  # the judge holds the loop now
    child.send_signal(signal.SIGTERM)  # once, as a job queue does
    try:
        output, _ = child.communicate(timeout=SIGTERM_GRACE_S + STOP_S)
    except subprocess.TimeoutExpired:
        pytest.fail("one SIGTERM did not stop the command")
    assert child.returncode == 143, output  # 128 + SIGTERM: "stopped by it" to a job queue
    assert "interrupted:" in output
