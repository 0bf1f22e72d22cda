"""`agentgym train --dry-run`: the run's plan from the checks a run makes, nothing written."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError
from agentgym.trainers import GRPOConfig
from agentgym.trainers._plan import dry_run
from agentgym.trainers._preflight import preflight
from agentgym.trainers._run_dir import RunDir
from tests.conftest import agentgym_here


def config(tmp_path: Path, **knobs: Any) -> GRPOConfig:
    return GRPOConfig(env="calculator", output_dir=str(tmp_path / "run"), max_steps=12,
                      tasks_per_step=2, num_generations=4, eval_steps=5, eval_num_tasks=10,
                      save_steps=4, report_to=["none"], **knobs)  # fmt: skip


def test_a_dry_run_describes_the_schedule_and_writes_no_run_folder(tmp_path: Path) -> None:
    plan = dict(dry_run(config(tmp_path)))
    assert plan["env"].startswith("agentgym/Calculator-v0: calculate;")
    assert plan["each step"].startswith("2 tasks x 4 generations = 8 episodes")
    assert plan["training"].startswith("12 GRPO steps (96 episodes)")
    assert plan["loss"] == "dapo; every other loss knob at its default"
    assert plan["evaluation"].endswith("after step 12; the first 10 at steps 5, 10")
    assert plan["checkpoints"] == "at steps 4, 8, 12; the newest 2 kept"
    assert plan["run folder"] == f"{tmp_path / 'run'}: a new run"
    assert not (tmp_path / "run").exists()


def test_a_dry_run_names_the_warm_start_the_cpu_memory_and_changed_loss_knobs(
    tmp_path: Path,
) -> None:
    plan = dict(dry_run(config(tmp_path, sft_steps=30, device="cpu", loss_type="grpo",
                               epsilon_high=0.28, top_entropy_quantile=0.2)))  # fmt: skip
    assert plan["loss"] == "grpo; epsilon_high 0.28, top_entropy_quantile 0.2"
    assert plan["training"].startswith(
        "30 full-weight SFT warm-start steps on 100% reference traces, then"
    )
    lora = dict(dry_run(config(tmp_path, sft_steps=30, sft_method="lora", lora_r=8)))
    assert lora["training"].startswith("30 LoRA r8 (merged) SFT warm-start steps")
    assert "on the base model, after the warm start and after step 12" in plan["evaluation"]
    assert "M parameters, ~" in plan["model"] and "to train on the CPU" in plan["model"]


def test_a_dry_run_shows_the_warm_up_of_the_learning_rate() -> None:
    """A warm-up of 10% of 12 steps was invisible: the plan said only "(linear)"."""
    warm = dict(dry_run(config(Path("unused"), lr_scheduler_type="linear", warmup_steps=0.1)))
    assert "learning rate 1e-05 (linear after 2 warm-up steps from 0)" in warm["training"]
    flat = dict(dry_run(config(Path("unused"))))
    assert flat["training"].endswith("(constant)")


def test_the_plan_shows_every_loss_knob_a_config_sets() -> None:
    """Each `LossSpec` knob taken from the config by name, and the adaptive entropy knobs."""
    import dataclasses

    from agentgym.trainers._loss import LossSpec
    from agentgym.trainers._plan import _LOSS_KNOBS

    config_knobs = {f.name for f in dataclasses.fields(GRPOConfig)}
    spec_knobs = {f.name for f in dataclasses.fields(LossSpec)} & config_knobs - {"loss_type"}
    assert spec_knobs and spec_knobs <= set(_LOSS_KNOBS), sorted(spec_knobs - set(_LOSS_KNOBS))
    adaptive = {name for name in config_knobs if name.startswith("entropy_")}
    assert {"use_adaptive_entropy", *adaptive} <= set(_LOSS_KNOBS)


def test_a_dry_run_makes_the_run_folders_refusals_and_leaves_it_alone(
    tmp_path: Path, detach_run_logs: Any
) -> None:
    cfg = config(tmp_path)
    digest = preflight(cfg).tasks_sha256
    from tests.trainers.test_run_dir import lora_model

    with RunDir(cfg.output_dir, cfg.to_dict(), tasks_sha256=digest) as run:
        run.save_checkpoint(8, *lora_model(0))  # a whole checkpoint: a damaged one is refused
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}

    with pytest.raises(ConfigError, match="already holds a run .* pass --resume"):
        dry_run(cfg)
    assert dict(dry_run(cfg, resume=True))["run folder"].endswith("resumes after step 8 of 12")
    with pytest.raises(ConfigError, match="config differs from the saved one in lora_r"):
        dry_run(config(tmp_path, lora_r=8), resume=True)

    after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert after == before


def test_a_dry_run_says_what_a_resume_keeps_of_a_run_stopped_in_its_warm_start(
    tmp_path: Path, detach_run_logs: Any, tiny_model_dir: Path
) -> None:
    """A run killed during its SFT warm start was said to "start over"; the warm start (done
    or checkpointed) is reused by the resume, and deleting the folder lost it."""
    from agentgym.runs._folder import SFT_SUMMARY, sft_checkpoint

    cfg = config(tmp_path, sft_steps=30)
    with RunDir(cfg.output_dir, cfg.to_dict(), tasks_sha256=preflight(cfg).tasks_sha256):
        pass
    warm_start = tmp_path / "run" / "sft"
    row = f"{tmp_path / 'run'}: holds a run with no GRPO checkpoint; "
    assert dict(dry_run(cfg, resume=True))["run folder"] == row + "it would start over"
    sft_checkpoint(warm_start).parent.mkdir(parents=True)
    sft_checkpoint(warm_start).write_bytes(b"state")
    assert dict(dry_run(cfg, resume=True))["run folder"] == (
        row + "its SFT warm start resumes from its checkpoint, then GRPO starts at step 1"
    )
    shutil.copytree(tiny_model_dir, warm_start)  # a whole model: a done warm start's files
    (warm_start / SFT_SUMMARY).write_text("{}")
    assert dict(dry_run(cfg, resume=True))["run folder"] == (
        row + "its SFT warm start is kept and GRPO starts at step 1"
    )


AGENTGYM = Path(sys.executable).with_name("agentgym")


def _run_config(tmp_path: Path, extra: str = "") -> Path:
    """A train config on the calculator env, its run folder under ``tmp_path`` (never made)."""
    path = tmp_path / "run.yaml"
    path.write_text(f"env: calculator\noutput_dir: {tmp_path / 'run'}\nreport_to: [none]\n{extra}")
    return path


def _dry_run(
    config: Path, *overrides: str, here: bool = False
) -> subprocess.CompletedProcess[str]:
    """``agentgym train CONFIG --dry-run``, each override passed as ``--set KEY=VALUE``.

    A refusal (one line, its exit code) is the console script's, run for real; a plan that
    passes is the command's work, run ``here`` (`agentgym_here`) without a new process's
    seconds of imports.
    """
    args = ["train", str(config), "--dry-run", *(a for pair in overrides for a in ("--set", pair))]
    if here:
        return agentgym_here(*args)
    return subprocess.run([str(AGENTGYM), *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def _error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def test_the_cli_prints_the_plan_or_one_line_naming_the_fix(tmp_path: Path) -> None:
    path = _run_config(tmp_path)
    ok = _dry_run(path, here=True)
    assert ok.returncode == 0, ok.stderr
    assert "each step    4 tasks x 8 generations = 32 episodes" in ok.stdout
    assert ok.stdout.rstrip().endswith("dry run: every check passed; nothing was trained and "
                                       "no run folder written")  # fmt: skip
    assert not (tmp_path / "run").exists()

    typo = _dry_run(path, "env=calculater")
    lines = _error_lines(typo)
    assert typo.returncode == 2 and len(lines) == 1, typo.stderr
    assert "calculator" in lines[0], typo.stderr  # "did you mean ..."


def test_a_base_models_tokenizer_under_a_chat_template_is_refused_before_the_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A base model (Qwen2.5 base: eos ``<|endoftext|>``, generation_config the same) under a
    ChatML template that ends turns with ``<|im_end|>``: the dry run passed it, the real run
    made its folder then died in the warm start with a message that named no fix."""
    import json
    import shutil

    model = tmp_path / "base_model"
    shutil.copytree(tiny_model_dir, model)
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer_config["eos_token"] = "<|endoftext|>"
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    generation = json.loads((model / "generation_config.json").read_text())
    generation["eos_token_id"] = generation["pad_token_id"]  # <|endoftext|>
    (model / "generation_config.json").write_text(json.dumps(generation))
    refused = _dry_run(_run_config(tmp_path, f"model: {model}\nsft_steps: 10\n"))
    lines = _error_lines(refused)
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "ends an assistant turn with '<|im_end|>'" in lines[0]
    assert "set eos_token to '<|im_end|>'" in lines[0]
    assert not (tmp_path / "run").exists()


def test_a_refusal_of_trains_names_the_option_as_train_takes_it(tmp_path: Path) -> None:
    """It said "use --env-arg parser=hermes", an option `agentgym train` does not have."""
    path = _run_config(tmp_path)
    refused = _dry_run(path, "env_kwargs.parser=llama3_json")
    assert refused.returncode == 2, refused.stderr
    fix = "--set env_kwargs.parser=hermes"
    assert f"(agentgym train: {fix})" in refused.stderr
    passed = _dry_run(path, fix.removeprefix("--set "), here=True)
    assert passed.returncode == 0  # the fix it names passes


def test_a_rollout_server_nobody_answers_is_infrastructure_not_a_bug(tmp_path: Path) -> None:
    """One line, exit 75 (a queue tries it again); it was 1, which the docs define as a bug."""
    import socket

    with socket.socket() as sock:  # a port nobody listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused = _dry_run(_run_config(tmp_path, f"rollout_servers: ['http://127.0.0.1:{port}']\n"))
    lines = _error_lines(refused)
    assert refused.returncode == 75 and len(lines) == 1, refused.stderr
    assert "is unreachable" in lines[0] and "rollout_servers" in lines[0]
    assert not (tmp_path / "run").exists()


TORCHRUN = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500"}  # fmt: skip


def test_a_dry_run_under_torchrun_refuses_an_unequal_split_and_names_the_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under torchrun the dry run said "every check passed" for tasks_per_step=3 on 2 ranks,
    which the run refuses."""
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="tasks_per_step=3 cannot be split equally among the 2"):
        dry_run(dataclasses.replace(config(tmp_path), tasks_per_step=3))
    plan = dict(dry_run(dataclasses.replace(config(tmp_path), tasks_per_step=4)))
    assert plan["processes"] == "2 (torchrun), 2 tasks a step each; rank 0 writes the run folder"
