"""Damaged run folders: each damaged file is named in one line with its fix, nothing is lost.

A probe found tracebacks instead: a cut-short checkpoint failed the resume once the model had
loaded (after the dry run called the folder fine); a broken status.json, summary.json, saved
config or metrics line failed the run folder's opening; a run that failed while loading left a
folder that refused its corrected rerun both with and without --resume; a dry run of a trillion
steps ran out of memory; a cut-short ``agentgym sft`` checkpoint gave a traceback.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError
from agentgym.trainers import GRPOConfig
from agentgym.trainers._plan import dry_run
from agentgym.trainers._preflight import preflight
from agentgym.trainers._run_dir import RunDir, read_jsonl_records
from agentgym.trainers._training_state import load_training_state
from tests.conftest import require
from tests.trainers.test_run_dir import CONFIG, lora_model, train_step

#: Runs a test leaves open keep a log handler; conftest.py drops them after each test.
pytestmark = pytest.mark.usefixtures("detach_run_logs")


def refusal(call: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the `ConfigError` ``call`` raises, checked to be one line."""
    with pytest.raises(ConfigError) as refused:
        call(*args, **kwargs)
    said = str(refused.value)
    assert "\n" not in said, said
    return said


def run_with_checkpoints(path: Path, config: dict[str, Any], *steps: int, **kw: Any) -> RunDir:
    """A run in ``path`` that wrote a metrics line and a real checkpoint at each of ``steps``."""
    model, optimizer = lora_model(0)
    run = RunDir(path, config, **kw)
    for step in steps:
        train_step(model, optimizer)
        run.write_metrics(step, {"loss": 1.0 / step})
        run.save_checkpoint(step, model, optimizer)
    return run


def cut_in_half(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


# --- 1. a damaged newest checkpoint ------------------------------------------------------------

DAMAGES = {
    "adapter/adapter_model.safetensors": (cut_in_half, "adapter_model.safetensors is cut short"),
    "trainer_state.json": (lambda f: f.write_text("{"), "trainer_state.json cannot be read"),
    "optimizer.pt": (cut_in_half, "optimizer.pt is missing or cut short"),
}


@pytest.mark.parametrize("damaged", sorted(DAMAGES))
def test_a_damaged_newest_checkpoint_is_refused_where_the_resume_chooses_it(
    tmp_path: Path, damaged: str
) -> None:
    """Refused by `check_open` (the dry run's check) and the opening, before a model loads."""
    run_with_checkpoints(tmp_path, CONFIG, 1, 2).mark_failed(RuntimeError("stopped"))
    damage, says = DAMAGES[damaged]
    damage(tmp_path / "checkpoints" / "step-000002" / damaged)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    for opening in (RunDir.check_open, RunDir):
        said = refusal(opening, tmp_path, CONFIG, resume=True)
        assert said.startswith(f"checkpoint checkpoints/step-000002 of {tmp_path} is damaged (")
        assert says in said
        assert said.endswith("delete that folder to resume after step 1 (the checkpoint before it)")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before

    model, optimizer = lora_model(1)  # what every training process loads refuses it too
    said = refusal(load_training_state, tmp_path / "checkpoints" / "step-000002", model, optimizer)
    assert "step-000002 is damaged" in said and says in said
    (tmp_path / "checkpoints" / "step-000002").rename(tmp_path / "deleted-step-2")
    assert RunDir(tmp_path, CONFIG, resume=True).resume_step == 1


def test_the_dry_run_reports_a_damaged_checkpoint_before_any_model_loads(tmp_path: Path) -> None:
    cfg = GRPOConfig(env="calculator", output_dir=str(tmp_path / "run"), max_steps=4,
                     tasks_per_step=2, num_generations=2, report_to=["none"])  # fmt: skip
    digest = preflight(cfg).tasks_sha256
    run_with_checkpoints(tmp_path / "run", cfg.to_dict(), 1, tasks_sha256=digest).mark_failed(
        RuntimeError("stopped")
    )
    cut_in_half(tmp_path / "run" / "checkpoints" / "step-000001" / "rng.pt")
    said = refusal(dry_run, cfg, resume=True)
    assert "step-000001" in said and "(its rng.pt is missing or cut short)" in said
    assert said.endswith("delete that folder to run again from step 1 (it has no older checkpoint)")


# --- 2. damaged files of the run folder -----------------------------------------------------------


@pytest.mark.parametrize("text", ['{"state": "runn', "", "[1, 2]"])
def test_a_damaged_status_json_is_named_with_its_fix(tmp_path: Path, text: str) -> None:
    RunDir(tmp_path, CONFIG).mark_failed(RuntimeError("stopped"))
    (tmp_path / "status.json").write_text(text)
    said = refusal(RunDir, tmp_path, CONFIG)
    assert said.startswith(f"{tmp_path} already holds a run (its status.json cannot be read); "
                           "pass --resume")  # fmt: skip
    said = refusal(RunDir, tmp_path, CONFIG, resume=True)
    assert said.startswith(f"{tmp_path / 'status.json'} ")
    assert said.endswith("; delete it to resume: the run writes it again")
    assert (tmp_path / "status.json").read_text() == text


def test_a_damaged_summary_json_is_named_when_a_finished_run_is_resumed(tmp_path: Path) -> None:
    run = RunDir(tmp_path, CONFIG)
    run.write_metrics(CONFIG["max_steps"], {"loss": 0.5})
    run.mark_finished()
    (tmp_path / "summary.json").write_text("garbage")
    said = refusal(RunDir.finished_figures, tmp_path, CONFIG["max_steps"], CONFIG)
    assert said.startswith(f"{tmp_path / 'summary.json'} cannot be read as JSON (")
    assert said.endswith("; delete it: the resume writes it again")


def test_resuming_into_a_file_names_the_file_not_a_status_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("a file where the run folder goes")
    said = refusal(RunDir.finished_figures, tmp_path / "runs" / "a", 10, CONFIG)
    assert said == (f"output_dir {tmp_path / 'runs' / 'a'}: {tmp_path / 'runs'} is a file, not a "
                    "folder; choose another output_dir")  # was a NotADirectoryError traceback


@pytest.mark.parametrize(
    ("text", "says"),
    [("- model\n- tiny\n", "holds a list, not a mapping of knobs"),
     ("model: [tiny\nlora_r: 8\n", "(while parsing a flow sequence")],
)  # fmt: skip
def test_a_damaged_saved_config_is_named_in_one_line(tmp_path: Path, text: str, says: str) -> None:
    run = RunDir(tmp_path, CONFIG)
    run.write_metrics(1, {"loss": 1.0})
    run.mark_failed(RuntimeError("stopped"))
    (tmp_path / "config.yaml").write_text(text)
    said = refusal(RunDir, tmp_path, CONFIG, resume=True)
    assert f"saved config {tmp_path / 'config.yaml'} " in said and says in said
    assert said.endswith("; restore it, or delete it to resume under the config given now")


def test_an_unreadable_metrics_line_moves_aside_on_resume_and_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A kill only tears the last line (cut off on reopening); a line broken in the middle
    failed the resume with a traceback. It is moved aside with the replayed steps' lines."""
    run_with_checkpoints(tmp_path, CONFIG, 1, 2).write_metrics(3, {"loss": 0.3})
    metrics = tmp_path / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join([lines[0], '{"step": 1, "lo\n', *lines[1:]]))

    with caplog.at_level(logging.WARNING, logger="agentgym"):
        run = RunDir(tmp_path, CONFIG, resume=True)
    assert run.resume_step == 2 and [r["step"] for r in read_jsonl_records(metrics)] == [1, 2]
    aside = (tmp_path / "metrics.rolled_back.jsonl").read_text().splitlines(keepends=True)
    assert aside == ['{"step": 1, "lo\n', lines[2]]
    assert "1 line(s) cannot be read as its records; moved them to metrics.rolled_back" in (
        caplog.text
    )


@pytest.mark.parametrize(
    ("line", "why"),
    [('{"step": 1, "lo\n', "not JSON: Unterminated string"), ("[1, 2]\n", "a JSON list")],
    ids=["torn", "not_an_object"],
)
def test_readers_of_a_run_name_a_damaged_middle_line_and_its_fix(
    tmp_path: Path, line: str, why: str
) -> None:
    """`agentgym export --best`, `report` and `runs doctor` read a run they do not resume: a
    line broken before the last one died in a JSON traceback (or an AttributeError on a list)."""
    from agentgym.trainers._export import best_checkpoint
    from agentgym.trainers._report import plot_curves

    run_with_checkpoints(tmp_path, CONFIG, 1)
    episodes = tmp_path / "eval_trajectories.jsonl"
    episodes.write_text(line + '{"status": "ok", "info": {"step": 1}}\n')
    said = refusal(best_checkpoint, tmp_path)
    assert said.startswith(f"line 1 of {episodes} is not a record ({why}")
    assert said.endswith("restore the file, or delete that line (resuming the run moves it aside)")
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(line + metrics.read_text())
    assert f"line 1 of {metrics} is not a record" in refusal(
        plot_curves, metrics, tmp_path / "curve.png", "run"
    )


# --- 3. a run that failed before its first step ---------------------------------------------------


@pytest.mark.parametrize("resume", [False, True])
def test_a_run_that_failed_before_its_first_step_is_taken_over_by_the_corrected_rerun(
    tmp_path: Path, resume: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A model folder with cut-short weights passes the dry run and fails while loading; the
    fixed config was then refused without --resume ("pass --resume") and with it ("config
    differs ... in model")."""
    RunDir(tmp_path, CONFIG).mark_failed(RuntimeError("SafetensorError: invalid header"))
    fixed = {**CONFIG, "model": "tiny-fixed"}

    with caplog.at_level(logging.WARNING, logger="agentgym"):
        run = RunDir(tmp_path, fixed, resume=resume)
    assert f"{tmp_path} holds a run that failed before finishing a step (RuntimeError: " in (
        caplog.text
    )
    assert not run.reopened and not run.resumed
    status = json.loads(run.status_path.read_text())
    assert status["attempt"] == 1 and status["taken_over"]["state"] == "failed"
    assert "SafetensorError" in status["taken_over"]["exit"]["error"]
    assert "tiny-fixed" in run.config_path.read_text()


def test_only_a_folder_a_failed_run_left_nothing_in_is_taken_over(tmp_path: Path) -> None:
    """Killed before its first checkpoint, resumed (its lines moved aside), then failed while
    loading: its rolled-back lines are a run's history, not to be mixed with a new run's; a
    folder of nothing but its config and status is taken over."""
    run = RunDir(tmp_path / "lines", CONFIG)
    run.write_metrics(1, {"loss": 1.0})  # then killed: no checkpoint
    RunDir(tmp_path / "lines", CONFIG, resume=True).mark_failed(RuntimeError("SafetensorError"))
    assert json.loads((tmp_path / "lines" / "status.json").read_text())["step"] is None
    RunDir(tmp_path / "empty", CONFIG).mark_failed(RuntimeError("SafetensorError"))
    fixed = {**CONFIG, "model": "tiny-fixed"}

    said = refusal(RunDir, tmp_path / "lines", fixed)
    assert "already holds a run (failed); pass --resume" in said
    said = refusal(RunDir, tmp_path / "lines", fixed, resume=True)
    assert "the config differs from the saved one in model" in said
    assert RunDir.check_open(tmp_path / "empty", fixed) is None  # the dry run's check agrees


# --- 4. a plan of very many steps -----------------------------------------------------------------


def test_the_plan_of_a_trillion_steps_counts_them_without_listing_them(tmp_path: Path) -> None:
    plan = dict(dry_run(GRPOConfig(env="calculator", output_dir=str(tmp_path / "run"),
                                   max_steps=10**12, eval_steps=7, save_steps=1,
                                   report_to=["none"])))  # fmt: skip
    assert plan["checkpoints"] == (
        f"at steps 1, 2, ..., {10**12} (1,000,000,000,000 times); the newest 2 kept"
    )
    assert plan["evaluation"].endswith("at steps 7, 14, ..., 999999999999 (142,857,142,857 times)")


# --- 5. agentgym sft's checkpoint -----------------------------------------------------------------


def sft_state(tmp_path: Path) -> tuple[Any, Any, Any, Any]:
    """A saved `_Checkpoint` of a one-layer model, and that model, optimizer and schedule."""
    torch = require("torch")
    from agentgym.trainers._sft import _Checkpoint

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    checkpoint = _Checkpoint(tmp_path / "out.partial" / "state.pt", "run-a", {}, "tiny")
    checkpoint.save(3, model, optimizer, schedule, [{"step": 3, "seconds": 1.0}])
    return checkpoint, model, optimizer, schedule


def test_a_cut_short_sft_checkpoint_is_named_with_its_fix(tmp_path: Path) -> None:
    checkpoint, model, optimizer, schedule = sft_state(tmp_path)
    cut_in_half(checkpoint.path)
    said = refusal(checkpoint.load, model, optimizer, schedule)
    assert said.startswith(f"{checkpoint.path} is damaged (")
    assert said.endswith("; delete it to start this SFT run over from step 1")


def test_an_sft_checkpoint_is_synced_before_and_after_its_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As GRPO checkpoints are: a power cut must not leave a renamed but empty state.pt."""
    synced: list[str] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:  # the real fsync, noting which file it synced
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    checkpoint, *_ = sft_state(tmp_path)
    tmp, folder = checkpoint.path.with_suffix(".tmp"), checkpoint.path.parent
    renamed = synced.index(str(tmp))  # the file's bytes, then its rename (then the record)
    assert synced[renamed:renamed + 2] == [str(tmp), str(folder)]
