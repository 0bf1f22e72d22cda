"""The experiments journey: trackers, the run index and the dashboard agree with metrics.jsonl.

Found by playing docs/experiments.md end to end (tiny model, calculator env, `report_to:
[tensorboard, trackio]`, a run killed with SIGKILL and resumed). trackio is replaced by a fake
that keeps its store's semantics: one series of points per run name, ``resume="allow"``
continuing the run of that name.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from agentgym.trainers import _tracking
from agentgym.trainers._tracking import Trackers

CONFIG = {"model": "tiny", "seed": 0}


class TrackioStore(types.ModuleType):
    """A `trackio` module whose runs are kept by name, as trackio's local store keeps them."""

    def __init__(self) -> None:
        super().__init__("trackio")
        self.runs: dict[str, list[tuple[int, dict[str, float]]]] = {}
        self.current: str | None = None

    def init(self, *, project: str, name: str, config: dict[str, Any], resume: str) -> None:
        assert resume == "allow"
        self.runs.setdefault(name, [])
        self.current = name

    def log(self, metrics: dict[str, float], step: int) -> None:
        assert self.current is not None
        self.runs[self.current].append((step, metrics))

    def finish(self) -> None:
        self.current = None


@pytest.fixture
def trackio(monkeypatch: pytest.MonkeyPatch) -> TrackioStore:
    store = TrackioStore()
    monkeypatch.setitem(sys.modules, "trackio", store)
    monkeypatch.setattr(_tracking, "_installed", lambda name: name == "trackio")
    return store


def _run_folder(path: Path, run_id: str) -> Path:
    """A run folder as `RunDir` leaves it: ``status.json`` names the run's own id."""
    path.mkdir(parents=True)
    (path / "status.json").write_text(json.dumps({"run_id": run_id, "step": 0}))
    return path


def _train(folder: Path, steps: range, resume_step: int | None = None) -> None:
    with Trackers(["trackio"], folder, CONFIG, resume_step=resume_step) as trackers:
        for step in steps:
            trackers.log(step, {"reward/mean": step / 10})


def test_runs_whose_folders_share_a_name_get_trackio_runs_of_their_own(
    tmp_path: Path, trackio: TrackioStore
) -> None:
    """`output_dir: exp1/a` then `exp2/a`: trackio resumed the first run and logged twice."""
    first = _run_folder(tmp_path / "exp1" / "a", "111111111111")
    second = _run_folder(tmp_path / "exp2" / "a", "222222222222")
    _train(first, range(1, 4))
    _train(second, range(1, 4))
    assert sorted(trackio.runs) == ["a-111111111111", "a-222222222222"]
    for points in trackio.runs.values():
        assert [step for step, _ in points] == [1, 2, 3]


def test_a_resumed_run_continues_its_own_trackio_run(tmp_path: Path, trackio: TrackioStore) -> None:
    folder = _run_folder(tmp_path / "a", "333333333333")
    _train(folder, range(1, 3))
    _train(folder, range(3, 5), resume_step=2)
    assert list(trackio.runs) == ["a-333333333333"]
    assert [step for step, _ in trackio.runs["a-333333333333"]] == [1, 2, 3, 4]


def test_a_run_killed_and_resumed_logs_each_step_once_to_trackio(
    tmp_path: Path, trackio: TrackioStore
) -> None:
    """Killed after step 3 with its last checkpoint at step 2: step 3 is replayed.

    trackio cannot drop points, so the replayed step is not logged a second time (the curve
    would fold back); TensorBoard purges and re-logs it (`test_tracking`).
    """
    folder = _run_folder(tmp_path / "killed", "444444444444")
    _train(folder, range(1, 4))
    # what the resume's rollback leaves: step 3's line moved aside, to be replayed
    rolled_back = {"step": 3, "time": 0.0, "reward/mean": 0.3}
    (folder / "metrics.rolled_back.jsonl").write_text(json.dumps(rolled_back) + "\n")
    _train(folder, range(3, 6), resume_step=2)
    steps = [step for step, _ in trackio.runs["killed-444444444444"]]
    assert steps == [1, 2, 3, 4, 5]


def test_a_fresh_run_logs_every_step_to_trackio(tmp_path: Path, trackio: TrackioStore) -> None:
    """Nothing is skipped without a resume, even if an old rollback file lies in the folder."""
    folder = _run_folder(tmp_path / "fresh", "555555555555")
    (folder / "metrics.rolled_back.jsonl").write_text('{"step": 9}\n')
    _train(folder, range(1, 4))
    assert [step for step, _ in trackio.runs["fresh-555555555555"]] == [1, 2, 3]


# --- the queue: `agentgym sweep --parallel N` / `agentgym serve --workers N` -------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_the_queue_runs_at_most_its_workers_at_once(
    workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agentgym sweep --grid seed=0,1` (parallel 1) started both trainings at once."""
    import asyncio

    from agentgym.runs import RunStore, _queue
    from agentgym.runs._jobs import submit_job
    from agentgym.runs._store import new_run_id

    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    sweep_id = new_run_id()
    ids = []
    for n in (1, 2, 3, 4):
        config = {"env": "calculator", "num_tasks": n}
        ids.append(submit_job(store, "eval", config, runs_root=tmp_path, source="sweep",
                              sweep_id=sweep_id))  # fmt: skip
    # each job a quick real process; what is measured is how many ran side by side
    monkeypatch.setattr(_queue, "job_command", lambda *a: [sys.executable, "-c", "pass"])
    queue = _queue.JobQueue(store, workers=workers, sweep_id=sweep_id, poll_s=0.01)
    in_flight: list[int] = []
    spawn = queue._spawn

    def counted(job: dict[str, Any]) -> None:
        spawn(job)
        in_flight.append(len(queue._tasks))

    monkeypatch.setattr(queue, "_spawn", counted)
    asyncio.run(queue.run(until_idle=True))
    assert len(in_flight) == 4 and max(in_flight) == workers
    assert {store.get_run(i)["status"] for i in ids} == {"finished"}  # type: ignore[index]


# --- a running run's step ------------------------------------------------------------------------


def test_a_running_run_shows_the_step_its_folder_reached(tmp_path: Path) -> None:
    """The index sets a run's step when it ends: `runs ls` and the dashboard showed `-`."""
    import os
    import socket

    from typer.testing import CliRunner

    from agentgym.runs import RunStore
    from agentgym.runs._cli import app
    from agentgym.serve._dashboard import run_summary

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    store = RunStore(db)
    folder = tmp_path / "live"
    folder.mkdir()
    (folder / "status.json").write_text(json.dumps({"run_id": "f" * 12, "step": 7}))
    run_id = store.create_run(
        kind="train", name="live", config={"seed": 0}, source="cli", status="running",
        run_dir=folder, pid=os.getpid(), host=socket.gethostname(),
    )  # fmt: skip
    assert run_summary(store.get_run(run_id))["step"] == 7  # type: ignore[arg-type]
    listed = CliRunner().invoke(app, ["ls", "--db", db], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if run_id in line)
    assert [cell.strip() for cell in row.split("│")][6] == "7"
    shown = CliRunner().invoke(app, ["show", run_id, "--db", db], env={"COLUMNS": "200"})
    fields = [[cell.strip() for cell in line.split("│")[1:3]] for line in shown.output.splitlines()]
    assert ["step", "7"] in fields
    # a finished run keeps the step the index recorded, whatever its folder says now
    store.update_run(run_id, status="finished", step=5)
    assert run_summary(store.get_run(run_id))["step"] == 5  # type: ignore[arg-type]


# --- runs compare ------------------------------------------------------------------------------


def test_compare_never_prints_two_different_figures_the_same(tmp_path: Path) -> None:
    """reward/last 0.91231 against 0.91234 both read 0.9123: as if the runs had tied."""
    from typer.testing import CliRunner

    from agentgym.runs import RunStore
    from agentgym.runs._cli import app

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    store = RunStore(db)
    ids = [
        store.create_run(kind="train", name=f"s{seed}", config={"seed": seed}, source="cli",
                         status="finished", figures={"reward/last": last, "steps": 3.0})
        for seed, last in ((0, 0.91231), (1, 0.91234))
    ]  # fmt: skip
    out = CliRunner().invoke(app, ["compare", *ids, "--db", db], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    rows = {cells[0]: cells[1:3] for line in out.output.splitlines()
            if len(cells := [c.strip() for c in line.split("│")[1:-1]]) == 3}  # fmt: skip
    assert rows["reward/last"] == ["0.91231", "0.91234"]
    assert rows["steps"] == ["3", "3"]  # equal figures keep the short form
    assert rows["seed"] == ["0", "1"]  # the config difference
