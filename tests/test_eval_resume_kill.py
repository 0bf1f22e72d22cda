"""`agentgym eval` killed for real (SIGKILL, Ctrl-C) at chosen moments, then resumed.

The promise (README, docs/architecture.md): a killed run resumes and loses nothing already
written; ``--resume`` plays only the missing episodes, so the result equals an uninterrupted
run. Each run is a real console-script process; the kill moment is picked by polling the
files it writes, never by sleeping. The env is the calculator with a per-episode delay read
from ``$SLOWCALC_DELAY`` (not an env option, so a slow run and its fast resume share one
config) and a reference that answers every third task wrong, so the summary's figures are
not all 1.0 and a lost or doubled episode shows in them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError

AGENTGYM = Path(sys.executable).parent / "agentgym"
ENV = "slowcalc:test/SlowCalc-v0"
TASKS, GROUP = 40, 2
PLAN = ["-n", str(TASKS), "-g", str(GROUP), "--seed", "7"]
#: every (task, sample) episode of PLAN
EPISODES = {(t, g) for t in range(TASKS) for g in range(GROUP)}
DEADLINE_S = 60.0

SLOW_ENV = """
import asyncio
import os

from agentgym import register
from agentgym.envs.calculator import CalculatorEnv


class SlowCalc(CalculatorEnv):
    def __init__(self, **kwargs):  # tasks from $SLOWCALC_TASK_SEED: they change, options do not
        kwargs.setdefault("seed", int(os.environ.get("SLOWCALC_TASK_SEED", "1234")))
        super().__init__(**kwargs)

    async def setup_episode(self, task):
        await asyncio.sleep(float(os.environ.get("SLOWCALC_DELAY", "0")))

    def reference_turns(self, task):
        turns = super().reference_turns(task)
        if int(task["answer"]) % 3 == 0:  # a third of the tasks answered wrong
            turns[-1] = "The answer is 1."
        return turns


register("test/SlowCalc-v0", SlowCalc)
"""


def with_slow_env(folder: Path) -> Path:
    """``folder`` with the env's module in it: the runs start there, so they import it."""
    (folder / "slowcalc.py").write_text(SLOW_ENV)
    return folder


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return with_slow_env(tmp_path)


def _env(delay: float, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        **os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb",
        "AGENTGYM_RUNS_DB": "off", "SLOWCALC_DELAY": str(delay), **(extra or {}),
    }  # fmt: skip


def start(
    workdir: Path, out: Path, *args: str, delay: float = 0.2, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """An eval of PLAN (two episodes in flight) in the background; output to files.

    The run starts with SIGINT's default disposition, as a command typed at a terminal does:
    a test suite started in the background by a script (``./.ci/run &``) inherits SIGINT
    ignored, and so would the run, which then plays to the end through a Ctrl-C.
    """
    log = (workdir / f"{out.name}.{time.monotonic_ns()}.log").open("wb")
    return subprocess.Popen(
        [str(AGENTGYM), "eval", ENV, *PLAN, "--concurrency", "2", "--out", str(out), *args],
        cwd=workdir, env=_env(delay, env), stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def run(
    workdir: Path,
    out: Path,
    *args: str,
    plan: list[str] = PLAN,
    delay: float = 0.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTGYM), "eval", ENV, *plan, "--out", str(out), *args],
        cwd=workdir, env=_env(delay, env), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def wait_for(proc: subprocess.Popen[bytes], what: str, ready: Callable[[], bool]) -> None:
    """Poll until ``ready()``; fail if the run ends first or the deadline passes."""
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        assert proc.poll() is None, f"the run ended (code {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S}s"
        time.sleep(0.01)


def lines(out: Path) -> int:
    path = out / "trajectories.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def kill(proc: subprocess.Popen[bytes], sig: signal.Signals) -> int:
    proc.send_signal(sig)
    return proc.wait(timeout=DEADLINE_S)


def killed_after(workdir: Path, out: Path, episodes: int, *args: str) -> None:
    """Start a run (``args``: e.g. ``--resume``); SIGKILL it once it wrote ``episodes`` more."""
    proc = start(workdir, out, *args)
    seen = lines(out)
    wait_for(proc, f"{episodes} more episodes", lambda: lines(out) >= seen + episodes)
    assert kill(proc, signal.SIGKILL) == -signal.SIGKILL


def keys(out: Path) -> Counter[tuple[int, int]]:
    records = (json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines())
    return Counter((r["task_index"], r["group_index"]) for r in records)


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary less its timings (the only figures two runs of one plan may differ in)."""
    return {k: v for k, v in summary.items() if not k.startswith("time/")}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The figures of PLAN played whole, once for the module: every test that resumes a run
    compares its summary with these (a dict no test changes)."""
    workdir = with_slow_env(tmp_path_factory.mktemp("uninterrupted"))
    out = workdir / "whole"
    proc = run(workdir, out)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert 0.5 < summary["reward/mean"] < 1.0 and summary["episodes"] == len(EPISODES)
    return figures(summary)


def assert_complete(out: Path, uninterrupted: dict[str, Any]) -> None:
    """Every episode exactly once, and the summary of an uninterrupted run."""
    counts = keys(out)
    assert set(counts) == EPISODES, f"missing {sorted(EPISODES - set(counts))[:5]}"
    assert [k for k, n in counts.items() if n > 1] == []
    assert figures(json.loads((out / "summary.json").read_text())) == uninterrupted
    assert sorted(p.name for p in out.iterdir()) == [
        "run.json", "summary.json", "trajectories.jsonl",
    ]  # no temp file left behind  # fmt: skip


@pytest.fixture(scope="module")
def killed_at_5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder as SIGKILL leaves it after 5 or more episodes, made once for the module:
    each test gets its own byte-for-byte copy (`killed_copy`), so none sees another's edits."""
    workdir = with_slow_env(tmp_path_factory.mktemp("killed"))
    killed_after(workdir, workdir / "run", 5)
    return workdir / "run"


@pytest.fixture
def killed_copy(workdir: Path, killed_at_5: Path) -> Path:
    """``workdir/run``: this test's copy of the folder `killed_at_5` left."""
    return Path(shutil.copytree(killed_at_5, workdir / "run"))


def resume(workdir: Path, out: Path) -> subprocess.CompletedProcess[str]:
    proc = run(workdir, out, "--resume")
    assert proc.returncode == 0, proc.stderr
    return proc


# --- SIGKILL at each moment of a run ------------------------------------------------------------


def test_killed_before_the_first_episode_resumes_to_the_whole_run(
    workdir: Path, uninterrupted: dict[str, Any]
) -> None:
    out = workdir / "run"
    proc = start(workdir, out, delay=30)  # no episode can finish before the kill
    wait_for(proc, "trajectories.jsonl", (out / "trajectories.jsonl").exists)
    assert kill(proc, signal.SIGKILL) == -signal.SIGKILL
    assert lines(out) == 0
    resume(workdir, out)
    assert_complete(out, uninterrupted)


def test_killed_mid_stream_resumes_without_losing_or_doubling_an_episode(
    workdir: Path, uninterrupted: dict[str, Any]
) -> None:
    out = workdir / "run"
    killed_after(workdir, out, 10)
    written = keys(out)
    assert 10 <= sum(written.values()) < len(EPISODES)
    before = (out / "trajectories.jsonl").read_bytes()
    resume(workdir, out)
    assert (out / "trajectories.jsonl").read_bytes().startswith(before)  # nothing rewritten
    assert_complete(out, uninterrupted)


def test_killed_twice_mid_stream_still_adds_up(
    workdir: Path, killed_copy: Path, uninterrupted: dict[str, Any]
) -> None:
    out = killed_copy  # killed once, after 5 episodes
    killed_after(workdir, out, 10, "--resume")
    resume(workdir, out)
    assert_complete(out, uninterrupted)


def test_killed_after_the_last_episode_before_the_summary(
    workdir: Path, uninterrupted: dict[str, Any]
) -> None:
    # every line written, the summary not yet (or its temp file half-written): as a kill
    # while the summary is being written leaves it
    out = workdir / "run"
    assert run(workdir, out).returncode == 0
    (out / "summary.json").unlink()
    (out / "summary.json.tmp").write_text('{"episodes": 8')
    resume(workdir, out)
    assert_complete(out, uninterrupted)


def test_resuming_a_finished_run_changes_nothing_and_reprints_its_summary(
    workdir: Path, uninterrupted: dict[str, Any]
) -> None:
    out = workdir / "run"
    proc = start(workdir, out, delay=0)
    wait_for(proc, "the summary", (out / "summary.json").exists)
    kill(proc, signal.SIGKILL)  # after the summary: nothing left to lose
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    proc2 = resume(workdir, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files  # timings kept too
    assert "reward/mean" in proc2.stdout and "summary.json" in proc2.stderr
    assert_complete(out, uninterrupted)


# --- what --resume accepts and refuses ------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        (["-n", "20", "-g", "2", "--seed", "7"], "num_tasks"),
        (["-n", "40", "-g", "3", "--seed", "7"], "group_size"),
        (["-n", "40", "-g", "2", "--seed", "8"], "seed"),
        ([*PLAN, "--env-arg", "max_turns=3"], "env_kwargs"),
    ],
)
def test_resuming_with_other_settings_is_refused_in_one_line_naming_the_fix(
    workdir: Path, killed_copy: Path, change: list[str], setting: str
) -> None:
    out = killed_copy
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    refused = run(workdir, out, "--resume", plan=change)
    assert refused.returncode == 2, refused.stderr
    message = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(message) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "run.json" in message[0] and "--out" in message[0]
    # the saved value and the new one, so the user knows what to pass
    saved = json.loads(files["run.json"])[setting]
    assert f"{setting} {json.dumps(saved)} there" in message[0], message[0]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


@pytest.mark.parametrize("record", ["other tasks", "no digest"])
def test_resuming_onto_other_tasks_under_the_same_settings_is_refused(
    workdir: Path, killed_copy: Path, record: str
) -> None:
    """The env's options are the same, its tasks are not (a new version of the env or of its
    data): resumed, the run would file episodes of new tasks under the old indices."""
    out = killed_copy
    if record == "no digest":  # a run.json written before digests were recorded
        saved = json.loads((out / "run.json").read_text())
        del saved["tasks_sha256"]
        (out / "run.json").write_text(json.dumps(saved))
        changed, expected = None, "does not record which tasks it played"
    else:
        changed, expected = {"SLOWCALC_TASK_SEED": "99"}, "played other tasks than the env has"
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    refused = run(workdir, out, "--resume", env=changed)
    assert refused.returncode == 2, refused.stderr
    message = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(message) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert expected in message[0] and "choose another --out" in message[0], message[0]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_resume_on_a_missing_or_empty_folder_starts_the_run(
    workdir: Path, uninterrupted: dict[str, Any], folder: str
) -> None:
    # a queue adds --resume to every retry, whether or not the first try wrote anything
    out = workdir / "run"
    if folder == "empty":
        out.mkdir()
    resume(workdir, out)
    assert_complete(out, uninterrupted)


def test_a_second_writer_on_a_running_folder_is_refused(
    workdir: Path, uninterrupted: dict[str, Any]
) -> None:
    # a user resuming a run that is still going (or a stale queue retry) must not play the
    # missing episodes a second time next to it
    out = workdir / "run"
    proc = start(workdir, out, delay=30)  # runs until killed: the second writer is never late
    wait_for(proc, "its run.json", lambda: (out / "run.json").exists())
    second = run(workdir, out, "--resume")
    assert second.returncode == 2, second.stderr
    message = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(message) == 1 and "Traceback" not in second.stderr, second.stderr
    assert "another agentgym eval is writing" in message[0] and "--out" in message[0]
    assert lines(out) == 0  # the refused writer played nothing
    kill(proc, signal.SIGKILL)
    resume(workdir, out)  # the lock died with its holder
    assert_complete(out, uninterrupted)


# --- Ctrl-C: a clean stop, then a resume ------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_cleanly_and_resumes(
    workdir: Path, uninterrupted: dict[str, Any], sig: signal.Signals
) -> None:
    """``kill PID`` (SIGTERM) takes Ctrl-C's path (`exit_on_sigterm`): it ended the process on
    the spot, leaving its servers, containers and workspace copies."""
    code = 128 + sig
    from agentgym.runs import RunStore

    db = workdir / "runs.db"
    out = workdir / "run"
    proc = start(workdir, out, env={"AGENTGYM_RUNS_DB": str(db)})
    wait_for(proc, "10 episodes", lambda: lines(out) >= 10)
    assert kill(proc, sig) == code  # unwound by the process itself, not cut short
    data = (out / "trajectories.jsonl").read_bytes()
    assert data.endswith(b"\n")  # what finished was flushed whole
    assert not (out / "summary.json").exists()  # a stopped run is not a finished one
    store = RunStore(str(db))
    try:
        [row] = store.list_runs()
    finally:
        store.close()
    assert row["status"] == "interrupted" and row["exit_code"] == code
    resume(workdir, out)
    assert_complete(out, uninterrupted)


def test_a_corrupt_line_mid_file_is_one_line_naming_it_not_a_traceback(
    workdir: Path, killed_copy: Path
) -> None:
    # a disk that lost a block, or a hand edit: not a torn last line, so not cut off silently
    out = killed_copy  # 5 or more lines: line 3 has whole lines after it
    results = out / "trajectories.jsonl"
    records = results.read_bytes().splitlines(keepends=True)
    results.write_bytes(b"".join([*records[:2], b"\x00\x00garbage\n", *records[3:]]))
    before = results.read_bytes()
    refused = run(workdir, out, "--resume")
    assert refused.returncode == 2, refused.stderr
    message = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(message) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert f"line 3 of {results}" in message[0] and "--resume" in message[0]
    assert results.read_bytes() == before


def test_a_forked_child_does_not_keep_the_folder_locked(tmp_path: Path) -> None:
    """vLLM forks its engine process on a GPU; an orphaned engine must not hold the lock."""
    from agentgym._eval_folder import FolderLock

    with FolderLock(tmp_path, warn=print) as lock:
        assert lock.acquire()
        child = os.fork()
        if child == 0:  # the child: its copy of the descriptor must be gone
            try:
                os.fstat(lock.fd)  # type: ignore[arg-type]
            except OSError:
                os._exit(0)
            os._exit(1)
        assert os.waitpid(child, 0)[1] == 0
        with pytest.raises(ConfigError, match="another agentgym eval"):
            FolderLock(tmp_path, warn=print).acquire()  # the parent still holds it
