"""The `agentgym` command line at its edges: what a probe of every command found.

Huge numbers ended in an OverflowError traceback (exit 1, "our bug") or took all memory; a
finished eval piped into ``| true`` was recorded as failed; ``check --episode-timeout inf``
called every played row crashed; ``sft`` took ``--seed -1`` and ``--lr inf``; ``--out=~/x``
made a folder named ``~``; ``sandbox`` options were checked only by Docker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

AGENTGYM = str(Path(sys.executable).with_name("agentgym"))
HUGE = "99999999999999999999999"


def agentgym(*args: str, cwd: Path, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTGYM_RUNS_DB": str(cwd / "runs.db"), "COLUMNS": "250"}
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run([AGENTGYM, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
        proc.returncode, proc.stderr)  # fmt: skip
    return lines[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["eval", "calculator", "--tasks", f"0:{HUGE}"], "reaches past task 10,000,000"),
        (["eval", "calculator", "--tasks", "0:3000000000"], "reaches past task 10,000,000"),
        (["eval", "calculator", "-g", "100000000"],  # 21 GB of planned episodes, then a stall
         "100 tasks x group_size 100,000,000 is 10,000,000,000 episodes, more than agentgym"),
        (["train", "examples/quickstart.yaml", "--dry-run", "--set", f"max_steps={HUGE}"],
         "max_steps=99999999999999999999999 is out of range; use at most"),
        (["train", "examples/quickstart.yaml", "--dry-run", "--set", f"num_generations={HUGE}"],
         "num_generations=99999999999999999999999 is out of range"),
        (["runs", "ls", "--limit", HUGE], "--limit"),
        (["sft", "tiny", "out", "--env", "calculator", "--seed", "-1"], "--seed must be in"),
        (["sft", "tiny", "out", "--env", "calculator", "--lr", "inf"], "finite number > 0"),
        (["check", "calculator", "--episode-timeout", "nan"], "--episode-timeout"),
        (["sandbox", "ls", "--cert-dir", "/tmp"], "--cert-dir is for a tcp:// daemon"),
        (["sandbox", "build", "--tag", ""], "image must be a Docker image reference"),
    ],
    ids=["tasks_huge", "tasks_3e9", "group_huge", "max_steps", "num_generations", "runs_limit",
         "sft_seed", "sft_lr", "check_nan", "cert_dir", "empty_tag"],
)  # fmt: skip
def test_a_value_out_of_range_is_one_line_before_any_work(
    tmp_path: Path, args: list[str], said: str
) -> None:
    cwd = Path(__file__).resolve().parents[1] if args[0] == "train" else tmp_path
    assert said in one_error_line(agentgym(*args, cwd=cwd))
    assert not (tmp_path / "out").exists()


def test_check_with_an_unbounded_episode_timeout_plays_its_rows(tmp_path: Path) -> None:
    """inf overflowed the thread join's clock: every played row read "check crashed"."""
    proc = agentgym("check", "calculator", "--episode-timeout", "inf", cwd=tmp_path)
    assert proc.returncode == 0 and "check crashed" not in proc.stdout, proc.stdout


def test_a_finished_eval_whose_reader_left_is_recorded_finished(tmp_path: Path) -> None:
    """``agentgym eval ... | true`` exited 1 (rich's broken-pipe exit) and was indexed
    ``failed``, its every episode and summary written."""
    env = {**os.environ, "AGENTGYM_RUNS_DB": str(tmp_path / "runs.db")}
    eval_ = subprocess.Popen([AGENTGYM, "eval", "calculator", "-n", "100", "--out", "ev"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    assert eval_.stdout is not None
    eval_.stdout.close()  # the reader goes away before the table is printed
    assert eval_.wait(120) == 0
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["episodes"] == 100
    listed = subprocess.run([AGENTGYM, "runs", "show", "ev"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "finished" in listed.stdout and "failed" not in listed.stdout, listed.stdout


def test_an_out_given_as_tilde_slash_is_under_home(tmp_path: Path) -> None:
    """``--out=~/x`` (bash leaves that "~") wrote into a folder named "~" in the cwd."""
    home = tmp_path / "home"
    home.mkdir()
    proc = agentgym("eval", "calculator", "-n", "1", "--out=~/ev", cwd=tmp_path, home=home)
    assert proc.returncode == 0, proc.stderr
    assert (home / "ev" / "summary.json").is_file() and not (tmp_path / "~").exists()


def test_an_empty_out_is_refused_not_the_current_folder(tmp_path: Path) -> None:
    """``--out "$OUT"`` with OUT unset wrote the run's files among the cwd's own."""
    proc = agentgym("eval", "calculator", "-n", "1", "--out", "", cwd=tmp_path)
    assert proc.returncode == 2 and "'--out': is empty; give a folder" in proc.stderr, proc.stderr
    assert not (tmp_path / "summary.json").exists()


def test_an_out_folder_named_with_escapes_is_printed_with_them_shown(tmp_path: Path) -> None:
    """Its name went to the terminal raw: OSC 52 in it writes the reader's clipboard."""
    name = "ev\x1b]52;c;aGk=\x07"
    proc = agentgym("eval", "calculator", "-n", "1", "--out", name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stderr + proc.stdout and "\x07" not in proc.stderr
    assert "ev\\x1b]52;c;aGk=\\x07/trajectories.jsonl" in proc.stderr
    assert (tmp_path / name / "summary.json").is_file()
