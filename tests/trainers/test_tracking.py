"""Trackers (report_to resolution, TensorBoard for real, trackio/W&B wiring) and the console."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError
from agentgym.trainers import _tracking
from agentgym.trainers._tracking import (
    Trackers,
    TrainingConsole,
    format_metrics,
    resolve_report_to,
    scalars,
)
from tests.conftest import require

CONFIG = {"model": "tiny", "lora_r": 8}


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The set of backends `_installed` reports; tests fill it."""
    present: set[str] = set()
    monkeypatch.setattr(_tracking, "_installed", lambda name: name in present)
    return present


class FakeTrackio(types.ModuleType):
    """Records what a `trackio` module is asked; ``fail_log`` makes `log` raise."""

    def __init__(self, fail_log: bool = False) -> None:
        super().__init__("trackio")
        self.calls: list[tuple[str, Any]] = []
        self.fail_log = fail_log

    def init(self, **kwargs: Any) -> None:
        self.calls.append(("init", kwargs))

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.fail_log:
            raise OSError("disk full")
        self.calls.append(("log", (step, metrics)))

    def finish(self) -> None:
        self.calls.append(("finish", None))


# --- report_to --------------------------------------------------------------------------------


def test_report_to_resolution(installed: set[str]) -> None:
    installed.update({"tensorboard", "wandb"})
    assert resolve_report_to(["auto"]) == ["tensorboard", "wandb"]
    assert resolve_report_to("none") == [] and resolve_report_to([]) == []
    assert resolve_report_to(["wandb", "wandb"]) == ["wandb"]
    with pytest.raises(ConfigError, match="unknown tracker 'mlflow'"):
        resolve_report_to(["mlflow"])
    with pytest.raises(ConfigError, match="'trackio' but it is not installed; pip install trackio"):
        resolve_report_to(["tensorboard", "trackio"])


def test_scalars_keep_numbers_only() -> None:
    torch = require("torch")
    np = require("numpy")
    values = scalars({"a": torch.tensor(0.5), "b": np.float32(2.0), "c": True, "d": "text",
                      "e": [1, 2], "f": 3})  # fmt: skip
    assert values == {"a": 0.5, "b": 2.0, "c": 1.0, "f": 3.0}


# --- backends ---------------------------------------------------------------------------------


def test_tensorboard_writes_scalars_and_a_resume_hides_replayed_steps(tmp_path: Path) -> None:
    require("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Trackers(["tensorboard"], tmp_path, CONFIG) as trackers:
        for step in (1, 2, 3):
            trackers.log(step, {"reward/mean": step / 10, "note": "skipped"})
    with Trackers(["tensorboard"], tmp_path, CONFIG, resume_step=1) as trackers:
        trackers.log(2, {"reward/mean": 0.9})  # step 2 replayed after resuming at 1

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    points = [(e.step, round(e.value, 3)) for e in events.Scalars("reward/mean")]
    assert points == [(1, 0.1), (2, 0.9)]
    assert "note" not in events.Tags()["scalars"]


def test_a_note_is_text_in_tensorboard_and_the_wandb_summary(
    tmp_path: Path, installed: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    require("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class Run:
        summary: dict[str, str] = {}

        def finish(self) -> None:
            pass

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: Run()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setitem(sys.modules, "trackio", FakeTrackio())
    installed.update({"tensorboard", "wandb", "trackio"})
    with Trackers(["auto"], tmp_path, CONFIG) as trackers:
        trackers.note(3, "health/tool-errors", "many tool calls fail: 80%\n    fix: warm start")
        assert trackers.active == ["tensorboard", "trackio", "wandb"]  # trackio takes no text
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    [event] = events.Tensors("health/tool-errors/text_summary")
    assert event.step == 3
    assert event.tensor_proto.string_val[0].decode() == (
        "many tool calls fail: 80%  \n    fix: warm start"  # markdown keeps the line break
    )
    assert Run.summary == {
        "health/tool-errors": "step 3: many tool calls fail: 80%\n    fix: warm start"
    }


def test_trackio_is_initialised_resumable_and_fed_each_step(
    tmp_path: Path, installed: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeTrackio()
    monkeypatch.setitem(sys.modules, "trackio", fake)
    installed.add("trackio")
    with Trackers(["auto"], tmp_path / "run-7", CONFIG, project="p") as trackers:
        trackers.log(4, {"reward/mean": 0.25})
    assert fake.calls == [
        ("init", {"project": "p", "name": "run-7", "config": CONFIG, "resume": "allow"}),
        ("log", (4, {"reward/mean": 0.25})),
        ("finish", None),
    ]


def test_wandb_runs_offline_without_a_key_and_resumes_the_same_run(
    tmp_path: Path, installed: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    inits: list[dict[str, Any]] = []
    logged: list[tuple[int, dict[str, float]]] = []

    class Run:
        def log(self, values: dict[str, float], step: int) -> None:
            logged.append((step, values))

        def finish(self) -> None:
            logged.append((-1, {}))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: inits.append(kw) or Run()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    installed.add("wandb")
    for _ in range(2):
        with Trackers(["wandb"], tmp_path, CONFIG) as trackers:
            trackers.log(1, {"x": 1.0})
    assert [kw["mode"] for kw in inits] == ["offline", "offline"]
    assert inits[0]["id"] == inits[1]["id"] and inits[0]["resume"] == "allow"
    assert inits[0]["dir"] == str(tmp_path) and logged == [(1, {"x": 1.0}), (-1, {})] * 2


def test_a_tracker_failing_mid_run_is_switched_off_once(
    tmp_path: Path, installed: set[str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "trackio", FakeTrackio(fail_log=True))
    installed.add("trackio")
    trackers = Trackers(["trackio"], tmp_path, CONFIG)
    trackers.log(1, {"x": 1.0})
    trackers.log(2, {"x": 2.0})
    assert trackers.active == []
    warnings = [r for r in caplog.records if "switched off" in r.getMessage()]
    assert len(warnings) == 1 and "disk full" in warnings[0].getMessage()


def test_a_tracker_that_cannot_start_is_a_config_error(
    tmp_path: Path, installed: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeTrackio()

    def refuse(**kwargs: Any) -> None:
        raise RuntimeError("no space")

    fake.init = refuse  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "trackio", fake)
    installed.add("trackio")
    with pytest.raises(ConfigError, match="tracker 'trackio' could not start: no space"):
        Trackers(["trackio"], tmp_path, CONFIG)


# --- console ----------------------------------------------------------------------------------


def test_format_metrics_is_compact_and_skips_absent_or_nan_values() -> None:
    line = format_metrics({
        "reward/mean": 0.4123, "reward/std": 0.2, "reward/success": 0.375,
        "loss/kl": math.nan, "loss/clip_ratio_low": 0.01, "loss/clip_ratio_high": 0.02,
        "time/rollout": 3.14159, "time/sync": 0.0512, "other": 7.0, "loss/entropy": 0.1469,
    })  # fmt: skip
    assert line == (
        "reward 0.412±0.200  success 38%  clip 3.0%  entropy 0.147  rollout 3.1s  sync 0.05s"
    )
    assert "coef 0.050" in format_metrics({"loss/entropy_coef": 0.05})  # with a bonus only


def test_console_prints_about_twenty_lines_a_run_plus_evals() -> None:
    rich_console = require("rich.console")
    console = rich_console.Console(record=True, width=160, force_terminal=False)
    with TrainingConsole(100, console=console) as display:
        for step in range(1, 101):
            metrics = {"reward/mean": step / 100}
            if step == 33:
                metrics["eval/success"] = 0.5
            display.update(step, metrics)
    lines = [line for line in console.export_text().splitlines() if line.startswith("step")]
    assert len(lines) == 21  # every 5th step, and the eval at step 33
    assert "step  33/100  reward 0.330  eval 50%" in lines and lines[-1].startswith("step 100/100")
