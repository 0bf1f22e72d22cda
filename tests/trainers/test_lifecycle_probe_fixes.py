"""What a prober found in the trainer's lifecycle: resumes, full disks, damaged and moved folders.

Each mistake is one line naming its fix, said before a model loads where it can be; nothing
that changes what a run learns passes silently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError
from agentgym.trainers import GRPOConfig
from agentgym.trainers._plan import dry_run
from agentgym.trainers._preflight import preflight
from agentgym.trainers._run_dir import RunDir
from tests.conftest import require
from tests.test_cli import one_error_line, run
from tests.trainers.test_damaged_run_folder import cut_in_half, refusal, run_with_checkpoints
from tests.trainers.test_export import write_run
from tests.trainers.test_run_dir import CONFIG, lora_model, train_step

#: Runs a test leaves open keep a log handler; conftest.py drops them after each test.
pytestmark = pytest.mark.usefixtures("detach_run_logs")


@contextlib.contextmanager
def tmpfs(folder: Path, size: str, *options: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted on ``folder`` (root only), unmounted after.

    Lazily: a file a failed test left open (a run's ``train.log``) must not keep it mounted.
    """
    folder.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs"]
    if os.geteuid() != 0 or subprocess.run([*mount, str(folder)], check=False).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def fill(folder: Path) -> None:
    """Write into ``folder`` until its file system is full."""
    with (folder / "filler").open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)


# --- A. a resume must not change the learning-rate schedule -----------------------------------


@pytest.mark.parametrize(
    ("schedule", "warmup", "why"),
    [("linear", 0, "lr_scheduler_type 'linear' decays to 0 at max_steps"),
     ("cosine", 2, "lr_scheduler_type 'cosine' decays to 0 at max_steps"),
     ("constant_with_warmup", 0.2, "warmup_steps 0.2 is a share of max_steps")],
)  # fmt: skip
def test_a_resume_that_would_change_the_learning_rate_is_refused(
    tmp_path: Path, schedule: str, warmup: float, why: str
) -> None:
    """Resumed with a larger max_steps, the rate of step 3 rose 1.67e-4 -> 2.5e-4, silently."""
    saved = {**CONFIG, "lr_scheduler_type": schedule, "warmup_steps": warmup, "max_steps": 6}
    run_with_checkpoints(tmp_path, saved, 1, 2).mark_interrupted(KeyboardInterrupt())
    before = GRPOConfig(lr_scheduler_type=schedule, warmup_steps=warmup, max_steps=6)
    after = GRPOConfig(lr_scheduler_type=schedule, warmup_steps=warmup, max_steps=12)
    changed = [s for s in range(3, 7) if before.learning_rate_at(s) != after.learning_rate_at(s)]
    assert changed  # the steps after the checkpoint would learn at other rates
    longer = {**saved, "max_steps": 12}
    for opening in (RunDir.check_open, RunDir):
        said = refusal(opening, tmp_path, longer, resume=True)
        assert said.startswith(f"cannot resume {tmp_path} with max_steps=12 (saved 6): {why}")
        assert "keep max_steps=6" in said
    assert RunDir(tmp_path, saved, resume=True).resume_step == 2  # the same max_steps resumes


@pytest.mark.parametrize(
    ("schedule", "warmup"), [("constant", 0), ("constant_with_warmup", 2)]
)
def test_a_schedule_that_ignores_max_steps_may_train_longer_on_resume(
    tmp_path: Path, schedule: str, warmup: int
) -> None:
    saved = {**CONFIG, "lr_scheduler_type": schedule, "warmup_steps": warmup, "max_steps": 6}
    run_with_checkpoints(tmp_path, saved, 1, 2).mark_interrupted(KeyboardInterrupt())
    before = GRPOConfig(lr_scheduler_type=schedule, warmup_steps=warmup, max_steps=6)
    after = GRPOConfig(lr_scheduler_type=schedule, warmup_steps=warmup, max_steps=12)
    assert [before.learning_rate_at(s) for s in range(1, 7)] == [
        after.learning_rate_at(s) for s in range(1, 7)
    ]
    assert RunDir(tmp_path, {**saved, "max_steps": 12}, resume=True).resume_step == 2


def test_the_dry_run_refuses_a_resume_that_would_change_the_schedule(tmp_path: Path) -> None:
    cfg = GRPOConfig(env="calculator", output_dir=str(tmp_path / "run"), max_steps=6,
                     tasks_per_step=2, num_generations=2, report_to=["none"],
                     lr_scheduler_type="linear")  # fmt: skip
    digest = preflight(cfg).tasks_sha256
    run_with_checkpoints(tmp_path / "run", cfg.to_dict(), 2, tasks_sha256=digest).mark_failed(
        RuntimeError("stopped")
    )
    cfg.max_steps = 12
    said = refusal(dry_run, cfg, resume=True)
    assert "with max_steps=12 (saved 6): lr_scheduler_type 'linear' decays" in said


# --- B. a full disk while a checkpoint is written ----------------------------------------------


def test_a_full_disk_during_a_checkpoint_is_one_line_recorded_in_status(tmp_path: Path) -> None:
    """On a real full tmpfs: torch's "unexpected pos" or safetensors' I/O error, 144 lines."""
    from agentgym.trainers._run_dir import CheckpointWriteError

    with tmpfs(tmp_path / "disk", "256k") as disk:
        model, optimizer = lora_model(0)
        run = RunDir(disk / "run", CONFIG)
        train_step(model, optimizer)
        run.save_checkpoint(1, model, optimizer)
        fill(disk)
        with pytest.raises(CheckpointWriteError) as failed:
            run.save_checkpoint(2, model, optimizer)
        said = str(failed.value)
        (disk / "filler").unlink()
        run.mark_failed(failed.value)
        status = json.loads(run.status_path.read_text())
        kept = sorted(p.name for p in run.checkpoints_dir.iterdir())
    assert "\n" not in said
    assert said.startswith(f"could not write the checkpoint of step 2 in {disk}/run/checkpoints (")
    assert "; no space left?); once fixed, run the same command with --resume" in said
    assert said.endswith("continues from the last complete checkpoint (step 1)")
    assert status["state"] == "failed"
    assert status["exit"]["error"] == f"CheckpointWriteError: {said}"
    assert kept == ["step-000001"]  # the half-written one is gone


def test_what_a_full_disk_raises_is_read_as_a_write_failure(tmp_path: Path) -> None:
    """Each writer's own error on a real full tmpfs; anything else is no write failure."""
    torch = require("torch")
    from safetensors.torch import save_file

    from agentgym.trainers._training_state import write_failure

    raised: list[BaseException] = []
    with tmpfs(tmp_path / "disk", "64k") as disk:
        fill(disk)
        for write in (lambda: torch.save({"w": torch.zeros(4096)}, disk / "optimizer.pt"),
                      lambda: save_file({"w": torch.zeros(4096)}, str(disk / "a.safetensors")),
                      lambda: (disk / "trainer_state.json").write_text("{}" * 4096)):  # fmt: skip
            with pytest.raises(Exception) as failed:  # noqa: PT011  # each writer its own type
                write()
            raised.append(failed.value)
    said = [write_failure(exc) for exc in raised]
    assert "unexpected pos" in str(said[0]) and "os error 28" in str(said[1])
    assert all(s is not None and s.endswith("; no space left?") for s in said), said
    denied = OSError(errno.EACCES, "Permission denied")
    assert write_failure(denied) == "[Errno 13] Permission denied"
    assert write_failure(RuntimeError("CUDA error: out of memory")) is None


# --- C. a damaged warm start -------------------------------------------------------------------


def test_a_cut_short_warm_start_is_refused_by_the_dry_run_and_the_resume(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """It passed the dry run ("resumes after step 2 of 6"); the resume then printed a 96-line
    SafetensorError once its engine loaded the model."""
    cfg = GRPOConfig(env="calculator", output_dir=str(tmp_path / "run"), max_steps=6,
                     tasks_per_step=2, num_generations=2, report_to=["none"],
                     sft_steps=4)  # fmt: skip
    digest = preflight(cfg).tasks_sha256
    run_with_checkpoints(tmp_path / "run", cfg.to_dict(), 2, tasks_sha256=digest).mark_failed(
        RuntimeError("stopped")
    )
    warm_start = tmp_path / "run" / "sft"
    shutil.copytree(tiny_model_dir, warm_start)
    (warm_start / "sft.json").write_text("{}")
    assert dict(dry_run(cfg, resume=True))["run folder"].endswith("resumes after step 2 of 6")
    cut_in_half(warm_start / "model.safetensors")
    for opening in (lambda: dry_run(cfg, resume=True),
                    lambda: RunDir(cfg.output_dir, cfg.to_dict(), resume=True,
                                   tasks_sha256=digest)):  # fmt: skip
        said = refusal(opening)
        assert said.startswith(f"the SFT warm start {warm_start} is damaged (model.safetensors ")
        assert f"delete {warm_start} (its sft.json with it) to redo the warm start" in said
    (warm_start / "model.safetensors").unlink()  # deleted, not cut: it passed the dry run
    said = refusal(lambda: dry_run(cfg, resume=True))
    assert said.startswith(f"the SFT warm start {warm_start} is damaged (no weights (no ")


def test_the_warm_start_is_synced_before_its_sft_json_marks_it_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after sft.json must not leave it beside unsynced (cut-short) weights."""
    from agentgym.trainers._sft import _save

    class Writes:  # what save_pretrained writes, without a model
        def save_pretrained(self, folder: Path) -> None:
            (Path(folder) / f"{type(self).__name__}.bin").write_bytes(b"weights")

    synced: list[str] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    _save(Writes(), Writes(), tmp_path / "sft", {"history": []})
    assert "Writes.bin" in synced
    assert synced.index("Writes.bin") < next(i for i, n in enumerate(synced) if "sft.json" in n)
    assert json.loads((tmp_path / "sft" / "sft.json").read_text()) == {"history": []}


# --- D, E, H. export ---------------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A run folder whose checkpoint's adapter was trained on the run's own warm start."""
    shutil.copytree(tiny_model_dir, tmp_path / "run" / "sft")
    return write_run(tmp_path, tmp_path / "run" / "sft", {2: 0})


def test_an_export_into_a_folder_it_cannot_make_is_one_line(tmp_path: Path, run_dir: Path) -> None:
    (tmp_path / "afile").write_text("x")
    proc = run("export", str(run_dir), str(tmp_path / "afile" / "out"))
    assert proc.returncode == 2
    assert one_error_line(proc).endswith(f"{tmp_path}/afile is a file, not a folder; choose "
                                         "another OUT")  # fmt: skip
    with tmpfs(tmp_path / "ro", "64k", "ro") as read_only:
        proc = run("export", str(run_dir), str(read_only / "out"))
    assert proc.returncode == 2
    assert one_error_line(proc).endswith(f"cannot write in {read_only}; choose another OUT")


def test_a_checkpoint_without_a_step_number_is_one_line_on_export(
    tmp_path: Path, run_dir: Path
) -> None:
    (run_dir / "checkpoints" / "step-000002" / "trainer_state.json").write_text('{"step": "two"}')
    proc = run("export", str(run_dir), str(tmp_path / "out"))
    assert proc.returncode == 2
    said = one_error_line(proc)
    assert "step-000002 is damaged (its trainer_state.json holds no step number)" in said
    assert not (tmp_path / "out").exists()


def test_a_moved_run_exports_on_its_own_warm_start(tmp_path: Path, run_dir: Path) -> None:
    """The adapter records the warm start by its absolute path, gone once the run moved."""
    from agentgym.trainers import export_run

    moved = tmp_path / "moved" / "run"
    moved.parent.mkdir()
    run_dir.rename(moved)
    out = export_run(moved, tmp_path / "out")
    info = json.loads((out / "export.json").read_text())
    assert info["base_model"] == str((moved / "sft").resolve())


def test_exporting_a_plain_model_folder_says_it_is_one_already(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    model = tmp_path / "s0"
    shutil.copytree(tiny_model_dir, model)
    (model / "sft.json").write_text("{}")
    proc = run("export", str(model), str(tmp_path / "out"))
    assert proc.returncode == 2
    said = one_error_line(proc)
    assert f"{model} is already a plain model (a fine-tuned model folder" in said
    assert f"agentgym eval ENV --policy vllm --model-path {model}` uses it directly" in said


# --- F. agentgym sft stopped by Ctrl-C ----------------------------------------------------------


def test_an_interrupted_sft_says_its_step_and_how_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It stopped silently with exit 130, where train and eval say what they kept."""
    from agentgym.runs._folder import sft_checkpoint
    from agentgym.trainers import _sft_cli

    out = tmp_path / "out"

    def trains_then_stops(*args: Any, **_: Any) -> Path:
        config = args[4]
        for step in (1, 2, 3):
            config.log({"step": step, "loss": 1.0})
            if step == 2:  # --save-every 2
                sft_checkpoint(out).parent.mkdir()
                sft_checkpoint(out).write_bytes(b"state")
        raise KeyboardInterrupt

    monkeypatch.setenv("AGENTGYM_RUNS_DB", f"sqlite:///{tmp_path / 'runs.db'}")
    monkeypatch.setattr(_sft_cli, "sft_warm_start", trains_then_stops)
    with pytest.raises(KeyboardInterrupt):
        _sft_cli.sft("tiny:quickstart", out, env="calculator", tasks="20:40", steps=6,
                     save_every=2)  # fmt: skip
    said = capsys.readouterr().out
    assert f"interrupted at step 3; run the same command to resume from {out}.partial\n" in said


# --- G. agentgym sft resumed with other --steps or --save-every ---------------------------------


def test_an_sft_resume_may_change_steps_and_save_every_but_names_other_knobs_as_options(
    tmp_path: Path,
) -> None:
    """Neither the data order nor the warm-up-then-constant rate depends on them."""
    from agentgym.trainers._sft import SFTConfig, _batch_order, _Checkpoint, _fingerprint, _knobs
    from agentgym.trainers._sft_cli import _knobs_named_as_options

    assert list(_batch_order(10, 4, 6, 0)) == list(_batch_order(10, 4, 12, 0))[:6]
    path = tmp_path / "out.partial" / "state.pt"

    def checkpoint(config: SFTConfig) -> _Checkpoint:
        return _Checkpoint(path, _fingerprint(config, "tiny", []), _knobs(config), "tiny")

    checkpoint(SFTConfig(steps=120, save_every=20)).write_record()
    path.write_bytes(b"the weights")  # never read: the record decides
    checkpoint(SFTConfig(steps=200, save_every=50)).refuse_another_run()  # resumed
    with pytest.raises(ConfigError) as refused, _knobs_named_as_options():
        checkpoint(SFTConfig(steps=200, lr=1e-4)).refuse_another_run()
    said = str(refused.value)
    assert "another SFT run, whose --lr (saved 0.002, now 0.0001) differ" in said
    assert "steps" not in said


def test_an_sft_resume_with_fewer_steps_than_its_checkpoint_is_refused(tmp_path: Path) -> None:
    from agentgym.trainers._sft import SFTConfig, _train
    from tests.trainers.test_damaged_run_folder import sft_state

    checkpoint, model, _, _ = sft_state(tmp_path)  # saved at step 3
    said = refusal(_train, model, [], [], SFTConfig(steps=2), checkpoint)
    assert said == (f"{checkpoint.path} holds step 3, past SFTConfig.steps 2; give 3 or more to "
                    f"resume it, or delete {checkpoint.folder}")  # fmt: skip


def test_the_fewer_steps_refusal_comes_from_the_record_before_the_weights_load(
    tmp_path: Path,
) -> None:
    """It came after the weights had loaded, behind a "sft resumed from ..." line."""
    from agentgym.trainers._sft import SFTConfig, _Checkpoint, _fingerprint, _knobs

    path = tmp_path / "out.partial" / "state.pt"
    config = SFTConfig(steps=6, save_every=2)
    saved = _Checkpoint(path, _fingerprint(config, "tiny", []), _knobs(config), "tiny")
    saved.write_record(4)
    path.write_bytes(b"the weights")  # never read: the record decides
    resumed = dataclasses.replace(config, steps=3)
    again = _Checkpoint(path, _fingerprint(resumed, "tiny", []), _knobs(resumed), "tiny")
    said = refusal(again.refuse_another_run, 3)
    assert said == (f"{path} holds step 4, past SFTConfig.steps 3; give 4 or more to resume it, "
                    f"or delete {path.parent}")  # fmt: skip
    again.refuse_another_run(4)  # at or past its step: resumed
