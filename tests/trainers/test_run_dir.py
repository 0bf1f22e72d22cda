"""RunDir: refusal and resume rules, crash-safe JSONL, atomic checkpoints, rollback on resume."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError, Trajectory
from agentgym.trainers._run_dir import RESUMABLE_KEYS, RunDir, read_jsonl_records
from agentgym.trainers._training_state import load_training_state
from tests.conftest import require

CONFIG: dict[str, Any] = {"model": "tiny", "lora_r": 8, "max_steps": 10, "report_to": ["auto"]}


#: Runs a test leaves open keep a log handler; conftest.py drops them after each test.
pytestmark = pytest.mark.usefixtures("detach_run_logs")


def steps(path: Path) -> list[int]:
    return [r["step"] for r in read_jsonl_records(path)]


# --- tiny PEFT model ------------------------------------------------------------------------


def lora_model(seed: int) -> tuple[Any, Any]:
    """A two-layer MLP with LoRA on both layers, and AdamW over the LoRA weights."""
    torch = require("torch")
    peft = require("peft")
    torch.manual_seed(seed)
    base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["0", "2"], init_lora_weights=False)
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    return model, optimizer


def train_step(model: Any, optimizer: Any) -> None:
    torch = require("torch")
    loss = model(torch.randn(3, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def lora_weights(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


# --- opening a folder -----------------------------------------------------------------------


def test_fresh_run_writes_config_and_running_status(tmp_path: Path) -> None:
    yaml = require("yaml")
    run = RunDir(tmp_path / "run", CONFIG)
    assert not run.resumed and run.resume_step is None
    assert yaml.safe_load(run.config_path.read_text()) == CONFIG
    status = json.loads(run.status_path.read_text())
    assert status["state"] == "running" and status["pid"] == os.getpid()
    assert status["attempt"] == 1 and "previous" not in status
    run.mark_finished()
    assert json.loads(run.status_path.read_text())["state"] == "finished"


def test_a_folder_holding_a_run_is_refused_without_resume(tmp_path: Path) -> None:
    RunDir(tmp_path, CONFIG).mark_finished()
    with pytest.raises(ConfigError, match="pass --resume to continue it, or choose a new"):
        RunDir(tmp_path, CONFIG)


@pytest.mark.parametrize("resume", [False, True])
def test_an_eval_folder_is_refused_before_its_summary_is_overwritten(
    tmp_path: Path, resume: bool
) -> None:
    """`agentgym eval --out` writes summary.json too: a train run there replaced it."""
    eval_out = tmp_path / "eval"
    eval_out.mkdir()
    (eval_out / "trajectories.jsonl").write_text("")
    (eval_out / "summary.json").write_text('{"episodes": 4}')
    with pytest.raises(ConfigError, match=r"output_dir .*eval holds an agentgym eval run "
                       r"\(trajectories.jsonl\), whose files this train run would overwrite; "
                       r"choose a folder of its own, such as .*eval/train$"):  # fmt: skip
        RunDir(eval_out, CONFIG, resume=resume)
    assert (eval_out / "summary.json").read_text() == '{"episodes": 4}'
    assert sorted(p.name for p in eval_out.iterdir()) == ["summary.json", "trajectories.jsonl"]


def test_a_killed_run_is_called_killed_when_a_new_run_is_refused(tmp_path: Path) -> None:
    RunDir(tmp_path, CONFIG).write_metrics(4, {"reward/mean": 0.0})
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs: the run's writer was killed
    status = json.loads((tmp_path / "status.json").read_text())
    (tmp_path / "status.json").write_text(json.dumps({**status, "pid": gone.pid}))
    with pytest.raises(ConfigError, match=r"already holds a run \(killed, last step 4\)"):
        RunDir(tmp_path, CONFIG)


def test_resume_on_a_folder_without_a_run_starts_fresh_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "notes.txt").write_text("not a run")
    with caplog.at_level(logging.WARNING, logger="agentgym"):
        run = RunDir(tmp_path, CONFIG, resume=True)
    assert not run.resumed and run.resume_step is None
    assert "holds no run; starting a new one" in caplog.text
    assert run.status["attempt"] == 1


def test_resume_refuses_a_changed_config_and_names_the_keys(tmp_path: Path) -> None:
    RunDir(tmp_path, CONFIG).mark_finished()
    changed = {**CONFIG, "lora_r": 16, "model": "other", "max_steps": 99}
    with pytest.raises(ConfigError) as info:
        RunDir(tmp_path, changed, resume=True)
    message = str(info.value)
    assert "lora_r (saved 8, now 16)" in message and "model (saved 'tiny', now 'other')" in message
    assert "max_steps" not in message.split("Only")[0]


def test_resume_refuses_other_tasks_under_the_same_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The config is the same, the env's tasks are not (a new version of the env or its data):
    the run would go on, under the old indices, on tasks it never saw."""
    RunDir(tmp_path, CONFIG, tasks_sha256="aaaa").mark_finished()
    with pytest.raises(ConfigError, match="trained on other tasks than the env has now .* "
                       "restore them, or start a new output_dir"):  # fmt: skip
        RunDir(tmp_path, CONFIG, resume=True, tasks_sha256="bbbb")
    run = RunDir(tmp_path, CONFIG, resume=True, tasks_sha256="aaaa")
    assert run.status["tasks_sha256"] == "aaaa"
    run.mark_finished()
    old = tmp_path / "old"  # recorded before digests were kept: resumed, with a warning
    RunDir(old, CONFIG).mark_finished()
    with caplog.at_level(logging.WARNING, logger="agentgym"):
        again = RunDir(old, CONFIG, resume=True, tasks_sha256="bbbb")
    assert "does not record which tasks it trained on" in caplog.text
    assert again.status["tasks_sha256"] == "bbbb"


def test_a_run_saved_before_a_knob_existed_resumes_with_its_default(tmp_path: Path) -> None:
    yaml = require("yaml")
    # the run was made by a version without "new_knob"; an upgrade must not strand it
    old, older = tmp_path / "a", tmp_path / "b"
    RunDir(old, CONFIG).mark_finished()
    RunDir(older, CONFIG).mark_finished()
    defaults = {"new_knob": 3, "lora_r": 99}
    run = RunDir(old, {**CONFIG, "new_knob": 3}, resume=True, defaults=defaults)
    assert run.reopened and yaml.safe_load(run.config_path.read_text())["new_knob"] == 3
    with pytest.raises(ConfigError, match=r"new_knob \(saved 3, now 5\)"):
        RunDir(old, {**CONFIG, "new_knob": 5}, resume=True, defaults=defaults)
    with pytest.raises(ConfigError, match=r"new_knob \(saved '<absent>', now 5\)"):
        RunDir(older, {**CONFIG, "new_knob": 5}, resume=True, defaults=defaults)


def test_resume_accepts_schedule_changes_and_saves_them(tmp_path: Path) -> None:
    yaml = require("yaml")
    assert {"max_steps", "eval_steps", "save_steps", "save_total_limit", "logging_steps",
            "report_to"} <= RESUMABLE_KEYS
    RunDir(tmp_path, CONFIG).mark_finished()
    run = RunDir(tmp_path, {**CONFIG, "max_steps": 20, "report_to": ["none"]}, resume=True)
    assert yaml.safe_load(run.config_path.read_text())["max_steps"] == 20
    assert run.status["attempt"] == 2 and run.status["previous"]["state"] == "finished"


def test_what_a_stopped_run_says_to_raise_may_change_on_resume(tmp_path: Path) -> None:
    """A run stopped because its episodes missed ``episode_deadline_s`` (or broke for
    ``infra_error_patience`` steps) says: raise it, then run again with --resume. The resume
    refused exactly that change, so its last checkpoint could not be used."""
    from agentgym.trainers._grpo import _broken_stop, _infra_stop

    late = [Trajectory(env_id="e", status="late") for _ in range(2)]
    infra = [Trajectory(env_id="e", status="infra_error", error="OSError") for _ in range(2)]
    said = [str(_broken_stop(late, 3, 3, 3)), str(_infra_stop(infra, 3, 3, 3))]
    assert "raise episode_deadline_s" in said[0] and "--resume" in said[0]
    assert "infra_error_patience sets the steps" in said[1]
    RunDir(tmp_path, {**CONFIG, "episode_deadline_s": 0.001, "infra_error_patience": 3})
    RunDir(tmp_path, {**CONFIG, "episode_deadline_s": 300, "infra_error_patience": 10},
           resume=True)  # fmt: skip


def test_a_run_another_live_process_writes_is_refused(tmp_path: Path) -> None:
    run = RunDir(tmp_path, CONFIG)
    owner = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        status = {**run.status, "pid": owner.pid}
        run.status_path.write_text(json.dumps(status))
        with pytest.raises(ConfigError, match=f"being written by process {owner.pid}"):
            RunDir(tmp_path, CONFIG, resume=True)
    finally:
        owner.communicate(b"")
    assert RunDir(tmp_path, CONFIG, resume=True).status["previous"]["state"] == "killed"


# --- JSONL streams --------------------------------------------------------------------------


def test_metrics_lines_carry_step_and_time_and_json_values(tmp_path: Path) -> None:
    torch = require("torch")
    run = RunDir(tmp_path, CONFIG)
    run.write_metrics(1, {"reward/mean": torch.tensor(0.5), "loss/kl": 0.01})
    run.write_metrics(2, {"reward/mean": 0.75})
    records = read_jsonl_records(run.metrics_path)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["reward/mean"] == 0.5 and isinstance(records[0]["time"], float)
    assert run.status["step"] == 2
    with pytest.raises(ValueError, match="'step'"):
        run.write_metrics(3, {"step": 3})


def test_eval_lines_record_the_step_without_touching_the_caller(tmp_path: Path) -> None:
    run = RunDir(tmp_path, CONFIG)
    trajectories = [Trajectory(env_id="calc", info={"k": i}) for i in range(3)]
    run.append_eval(5, trajectories)
    records = read_jsonl_records(run.eval_path)
    assert [r["info"] for r in records] == [{"k": i, "step": 5, "eval": "eval"} for i in range(3)]
    assert trajectories[0].info == {"k": 0}


def test_a_torn_last_line_is_cut_when_the_run_reopens(tmp_path: Path) -> None:
    model, optimizer = lora_model(seed=0)
    run = RunDir(tmp_path, CONFIG)
    run.write_metrics(0, {"eval/success": 0.1})
    run.save_checkpoint(0, model, optimizer)
    with run.metrics_path.open("a") as f:
        f.write('{"step": 1, "reward/me')
    run.append_rollouts(0, [Trajectory(env_id="calc")])
    with run.rollouts_path.open("a") as f:
        f.write('{"env_id": "ca')
    resumed = RunDir(tmp_path, CONFIG, resume=True)
    assert resumed.resume_step == 0
    assert resumed.metrics_path.read_text().endswith('"eval/success": 0.1}\n')
    assert not (tmp_path / "metrics.rolled_back.jsonl").exists()
    assert [r["env_id"] for r in read_jsonl_records(resumed.rollouts_path)] == ["calc"]
    assert resumed.rollouts_path.read_text().endswith("}\n")


def test_kill_9_while_writing_loses_at_most_the_line_being_written(tmp_path: Path) -> None:
    writer = textwrap.dedent(f"""
        import sys
        from agentgym.trainers._run_dir import RunDir
        run = RunDir({str(tmp_path)!r}, {CONFIG!r})
        for step in range(1, 100_000):
            run.write_metrics(step, {{"reward/mean": step / 7, "pad": "x" * 3000}})
            print(step, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # the child reports each step once its line is fsynced
        if int(line) >= 5:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run = RunDir(tmp_path, CONFIG, resume=True)
    assert run.status["previous"]["state"] == "killed"
    # no checkpoint: a resume starts over, every line written is kept aside, none is torn
    rolled = steps(tmp_path / "metrics.rolled_back.jsonl")
    assert rolled[:5] == [1, 2, 3, 4, 5] and rolled == list(range(1, len(rolled) + 1))
    assert steps(run.metrics_path) == [] and not run.resumed


# --- checkpoints ----------------------------------------------------------------------------


def test_checkpoint_restores_adapter_optimizer_and_rng_state(tmp_path: Path) -> None:
    torch = require("torch")
    np = require("numpy")
    model, optimizer = lora_model(seed=0)
    train_step(model, optimizer)
    run = RunDir(tmp_path, CONFIG)
    path = run.save_checkpoint(3, model, optimizer, {"adapter_version": 3})
    assert path.name == "step-000003" and (path / "adapter" / "adapter_config.json").is_file()
    saved, saved_opt = lora_weights(model), optimizer.state_dict()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())

    other, other_opt = lora_model(seed=1)  # a fresh process: other weights, no optimizer state
    assert any(not torch.equal(saved[k], v) for k, v in lora_weights(other).items())
    resumed = RunDir(tmp_path, CONFIG, resume=True)
    assert resumed.latest_checkpoint() == path
    state = load_training_state(path, other, other_opt)

    assert state == {"step": 3, "adapter_version": 3}
    assert all(torch.equal(saved[k], v) for k, v in lora_weights(other).items())
    restored = other_opt.state_dict()["state"]
    assert restored.keys() == saved_opt["state"].keys()
    for key, value in saved_opt["state"].items():
        assert torch.equal(restored[key]["exp_avg"], value["exp_avg"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_a_checkpoint_of_another_lora_shape_is_refused(tmp_path: Path) -> None:
    peft = require("peft")
    torch = require("torch")
    model, optimizer = lora_model(seed=0)
    run = RunDir(tmp_path, CONFIG)
    path = run.save_checkpoint(1, model, optimizer)
    base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    narrow = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["0"]))
    with pytest.raises(ConfigError, match="does not fit the model"):
        load_training_state(path, narrow, optimizer)


def test_only_the_last_checkpoints_are_kept_and_half_written_ones_ignored(tmp_path: Path) -> None:
    model, optimizer = lora_model(seed=0)
    run = RunDir(tmp_path, CONFIG, keep=2)
    for step in (2, 4, 6):
        run.save_checkpoint(step, model, optimizer)
    names = sorted(p.name for p in run.checkpoints_dir.iterdir())
    assert names == ["step-000004", "step-000006"]
    torn = run.checkpoints_dir / ".tmp-step-000008-dead"
    (torn / "adapter").mkdir(parents=True)
    (run.checkpoints_dir / "step-000010").mkdir()  # no trainer_state.json: never completed
    assert run.latest_checkpoint() == run.checkpoints_dir / "step-000006"
    assert not torn.exists()


def test_keep_none_keeps_every_checkpoint(tmp_path: Path) -> None:
    model, optimizer = lora_model(seed=0)
    run = RunDir(tmp_path, CONFIG, keep=None)  # GRPOConfig.save_total_limit: null
    for step in (2, 4):
        run.save_checkpoint(step, model, optimizer)
    torn = run.checkpoints_dir / ".tmp-step-000005-dead"  # a save killed midway
    (torn / "adapter").mkdir(parents=True)
    run.save_checkpoint(6, model, optimizer)
    assert not torn.exists()  # every save clears those, whatever it keeps
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == [
        "step-000002", "step-000004", "step-000006"
    ]


def test_a_failed_save_leaves_no_checkpoint(tmp_path: Path) -> None:
    model, optimizer = lora_model(seed=0)
    run = RunDir(tmp_path, CONFIG)
    with pytest.raises(TypeError):
        run.save_checkpoint(1, model, optimizer, {"bad": object()})
    with pytest.raises(ValueError, match="'step'"):
        run.save_checkpoint(1, model, optimizer, {"step": 1})
    assert run.latest_checkpoint() is None and list(run.checkpoints_dir.iterdir()) == []


def test_resume_moves_lines_after_the_checkpoint_aside(tmp_path: Path) -> None:
    model, optimizer = lora_model(seed=0)
    run = RunDir(tmp_path, CONFIG)
    for step in range(1, 6):
        run.write_metrics(step, {"reward/mean": float(step)})
        if step in (2, 4):
            run.append_eval(step, [Trajectory(env_id="calc")])
        run.append_rollouts(step, [Trajectory(env_id="calc", info={"seed": step})] * 2)
        if step == 3:
            run.save_checkpoint(step, model, optimizer, {"adapter_version": step})
    # killed after step 5 without a clean end

    resumed = RunDir(tmp_path, CONFIG, resume=True)
    assert resumed.resumed and resumed.resume_step == 3
    assert resumed.status["previous"]["state"] == "killed"
    assert steps(resumed.metrics_path) == [1, 2, 3]
    assert steps(tmp_path / "metrics.rolled_back.jsonl") == [4, 5]
    evals = [r["info"]["step"] for r in read_jsonl_records(resumed.eval_path)]
    rolled = read_jsonl_records(tmp_path / "eval_trajectories.rolled_back.jsonl")
    assert evals == [2] and [r["info"]["step"] for r in rolled] == [4]
    rollouts = read_jsonl_records(resumed.rollouts_path)
    assert [(r["info"]["step"], r["info"]["seed"]) for r in rollouts] == [
        (1, 1), (1, 1), (2, 2), (2, 2), (3, 3), (3, 3)
    ]  # each episode's own info kept beside its step
    rolled = read_jsonl_records(tmp_path / "rollouts.rolled_back.jsonl")
    assert [r["info"]["step"] for r in rolled] == [4, 4, 5, 5]
    state = load_training_state(resumed.latest_checkpoint() or Path(), model, optimizer)
    assert state["step"] == 3 and steps(resumed.metrics_path) == [1, 2, 3]  # loading writes nothing
    assert resumed.rollback(3) == 0  # idempotent
    assert "from checkpoint step 3; moved 7 lines of later steps aside" in (
        resumed.log_path.read_text()
    )


def test_a_resume_after_the_last_checkpoint_runs_the_final_eval_once(tmp_path: Path) -> None:
    # killed after the final eval was written (the last checkpoint comes before it)
    model, optimizer = lora_model(seed=0)
    run = RunDir(tmp_path, CONFIG)
    run.write_metrics(0, {"base/success": 0.1})
    run.write_metrics(0, {"eval/success": 0.2})
    run.write_metrics(6, {"reward/mean": 1.0})
    run.save_checkpoint(6, model, optimizer)
    run.append_eval(6, [Trajectory(env_id="calc")] * 2, label="final")
    run.write_metrics(6, {"final/success": 0.9})

    resumed = RunDir(tmp_path, CONFIG, resume=True)
    assert resumed.resume_step == 6
    assert read_jsonl_records(resumed.eval_path) == []  # the final eval runs again: once
    rows = read_jsonl_records(resumed.metrics_path)
    assert not any("final/success" in r for r in rows) and len(rows) == 3
    assert resumed.headline_figures("sft/success") == {"base/success": 0.1, "sft/success": 0.2}


def test_a_finished_run_has_nothing_to_resume_unless_it_gets_more_steps(tmp_path: Path) -> None:
    run = RunDir(tmp_path, CONFIG)
    run.write_metrics(10, {"reward/mean": 1.0})
    assert RunDir.finished_figures(tmp_path, 10, CONFIG) is None  # still running
    (tmp_path / "summary.json").write_text(json.dumps({"figures": {"grpo/success": 0.9}}))
    run.mark_finished()
    assert RunDir.finished_figures(tmp_path, 10, CONFIG) == {"grpo/success": 0.9}
    assert RunDir.finished_figures(tmp_path, 20, CONFIG) is None  # max_steps raised: trains on
    with pytest.raises(ConfigError, match="the config differs from the saved one in lora_r"):
        RunDir.finished_figures(tmp_path, 10, {**CONFIG, "lora_r": 4})  # refused, as a resume


# --- adapters and status --------------------------------------------------------------------


def test_adapters_are_saved_atomically_and_pruned(tmp_path: Path) -> None:
    model, _ = lora_model(seed=0)
    run = RunDir(tmp_path, CONFIG, keep_adapters=2)
    paths = [run.save_adapter(model, version) for version in range(1, 5)]
    assert paths[-1] == run.adapter_dir(4) == tmp_path / "adapters" / "v4"
    assert sorted(p.name for p in run.adapters_dir.iterdir()) == ["v3", "v4"]
    assert sorted(p.name for p in paths[-1].iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"
    ]
    assert run.save_adapter(model, 4) == paths[-1]  # a version saved again is replaced
    peft_utils = require("peft.utils")
    torch = require("torch")
    other, _ = lora_model(seed=1)
    peft = require("peft")
    peft.set_peft_model_state_dict(other, peft_utils.load_peft_weights(str(paths[-1])))
    saved = lora_weights(model)
    assert all(torch.equal(saved[k], v) for k, v in lora_weights(other).items())


def test_every_adapter_save_writes_what_peft_would_after_training_steps(tmp_path: Path) -> None:
    """Saves after the first read the live parameters (the layout is worked out once)."""
    model, optimizer = lora_model(seed=0)
    torch = require("torch")
    peft = require("peft")
    safetensors = require("safetensors.torch")
    run = RunDir(tmp_path, CONFIG)
    for version in range(1, 4):
        train_step(model, optimizer)  # the optimiser moves the LoRA weights in place
        folder = run.save_adapter(model, version)
        written = safetensors.load_file(str(folder / "adapter_model.safetensors"))
        expected = peft.get_peft_model_state_dict(model)
        assert written.keys() == expected.keys() and len(written) == 4
        assert all(torch.equal(written[k], v) for k, v in expected.items()), version
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["r"] == 2 and config["target_modules"] in (["0", "2"], ["2", "0"])
    assert not torch.equal(written[k := next(iter(written))], safetensors.load_file(
        str(run.adapter_dir(2) / "adapter_model.safetensors"))[k])  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_adapter_file_is_byte_for_byte_what_safetensors_torch_writes(
    tmp_path: Path, dtype: str
) -> None:
    """float32/float16 take safetensors' numpy front end (faster), bfloat16 its torch one."""
    torch = require("torch")
    peft = require("peft")
    safetensors = require("safetensors.torch")
    model, _ = lora_model(seed=0)
    model.to(getattr(torch, dtype))
    folder = RunDir(tmp_path, CONFIG).save_adapter(model, 1)
    expected = {k: v.contiguous() for k, v in peft.get_peft_model_state_dict(model).items()}
    written = (folder / "adapter_model.safetensors").read_bytes()
    assert written == safetensors.save(expected, metadata={"format": "pt"})


def test_mark_failed_records_the_error(tmp_path: Path) -> None:
    run = RunDir(tmp_path, CONFIG)
    try:
        raise RuntimeError("engine died")
    except RuntimeError as exc:
        run.mark_failed(exc)
    status = json.loads(run.status_path.read_text())
    assert status["state"] == "failed"
    assert status["exit"]["error"] == "RuntimeError: engine died"
    assert "raise RuntimeError" in status["exit"]["traceback"]


def test_an_atomic_folder_that_must_not_replace_refuses_one_made_meanwhile(tmp_path: Path) -> None:
    from agentgym.trainers._run_dir import atomic_dir

    final = tmp_path / "out"
    with pytest.raises(ConfigError, match="made meanwhile"):
        with atomic_dir(final, replace=False) as tmp:
            (tmp / "mine.txt").write_text("mine")
            final.mkdir()  # another writer (a second export) got there first
            (final / "theirs.txt").write_text("theirs")
    assert [p.name for p in final.iterdir()] == ["theirs.txt"]  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temp folder left
