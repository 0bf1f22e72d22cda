"""`agentgym export`: a run's adapter, alone or merged into its base, served as trained.

The run folders here are made by hand (config, checkpoints with a real PEFT adapter on the tiny
model) so the tests need no training run; the merged folder is served by a real vLLM engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from agentgym import ConfigError
from tests.conftest import agentgym_here, require
from tests.test_cli import one_error_line, run

PROMPT = [5, 17, 99, 3, 42, 8]


def write_run(root: Path, base: Path, steps: dict[int, int]) -> Path:
    """A run folder with one checkpoint per ``{step: seed}``, each a random LoRA adapter."""
    torch = require("torch")
    peft = require("peft")
    from transformers import AutoModelForCausalLM

    run_dir = root / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"model: {base}\n")
    for step, seed in steps.items():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                               init_lora_weights=False)  # fmt: skip  # random A and B
        checkpoint = run_dir / "checkpoints" / f"step-{step:06d}"
        peft.get_peft_model(model, lora).save_pretrained(checkpoint / "adapter")
        (checkpoint / "trainer_state.json").write_text(json.dumps({"step": step}))
    return run_dir


def digest(folder: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            sha.update(path.name.encode() + path.read_bytes())
    return sha.hexdigest()


def test_the_adapter_of_the_newest_or_a_chosen_checkpoint_is_exported(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from agentgym.trainers import export_run

    run_dir = write_run(tmp_path, tiny_model_dir, {2: 0, 4: 1})
    newest = export_run(run_dir, tmp_path / "newest")
    adapter = run_dir / "checkpoints" / "step-000004" / "adapter"
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (newest / name).read_bytes() == (adapter / name).read_bytes()
    info = json.loads((newest / "export.json").read_text())
    assert info == {"run": str(run_dir.resolve()), "step": 4,
                    "base_model": str(tiny_model_dir.resolve()), "merged": False}  # fmt: skip
    chosen = export_run(run_dir, tmp_path / "chosen", step=2)
    old = run_dir / "checkpoints" / "step-000002" / "adapter" / "adapter_model.safetensors"
    assert (chosen / "adapter_model.safetensors").read_bytes() == old.read_bytes()
    assert json.loads((chosen / "export.json").read_text())["step"] == 2
    proc = run("export", str(run_dir), str(tmp_path / "cli"), env_vars={"COLUMNS": "40"})
    assert proc.returncode == 0, proc.stderr
    command = f"vllm serve {tiny_model_dir.resolve()} --enable-lora --lora-modules cli={tmp_path}"
    assert f"serve it: {command}/cli\n" in proc.stdout  # whole on one line, to paste


def test_what_cannot_be_exported_is_named_with_its_fix(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from agentgym.trainers import export_run

    with pytest.raises(ConfigError, match="is not a run folder .* pass a run's output_dir"):
        export_run(tmp_path, tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text("model: tiny\n")
    with pytest.raises(ConfigError, match="no checkpoint yet; a run saves one every save_steps"):
        export_run(empty, tmp_path / "out")
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    run_dir = write_run(tmp_path, base, {2: 0, 4: 1})
    with pytest.raises(ConfigError, match="no checkpoint of step 3; it keeps steps 2, 4"):
        export_run(run_dir, tmp_path / "out", step=3)
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConfigError, match="already exists; export into a new folder"):
        export_run(run_dir, tmp_path / "taken")
    moved = tmp_path / "moved"
    base.rename(moved)
    with pytest.raises(ConfigError, match=f"base model {base} is gone .* --base-model DIR"):
        export_run(run_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written was left
    done = export_run(run_dir, tmp_path / "out", base_model=moved)
    assert json.loads((done / "export.json").read_text())["base_model"] == str(moved)
    proc = run("export", str(run_dir), str(tmp_path / "cli"), "--step", "3")
    assert proc.returncode == 2 and "it keeps steps 2, 4" in one_error_line(proc)


def test_an_adapter_to_evaluate_is_found_in_a_run_a_checkpoint_or_an_export(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`agentgym eval --adapter` takes any of the folders a run leaves, and finds the base."""
    from agentgym.trainers import export_run
    from agentgym.trainers._export import trained_adapter

    run_dir = write_run(tmp_path, tiny_model_dir, {2: 0, 4: 1})
    newest, base = run_dir / "checkpoints" / "step-000004" / "adapter", tiny_model_dir.resolve()
    assert trained_adapter(run_dir) == (newest, base)  # a run: its newest checkpoint
    assert trained_adapter(newest.parent) == (newest, base)
    assert trained_adapter(newest) == (newest, base)
    exported = export_run(run_dir, tmp_path / "exported", step=2)
    assert trained_adapter(exported) == (exported, base)
    with pytest.raises(ConfigError, match="not a LoRA adapter .* a checkpoint or a run folder"):
        trained_adapter(tmp_path)
    with pytest.raises(ConfigError, match="is gone .* pass the folder it is in now with --model"):
        trained_adapter(newest, tmp_path / "nowhere", base_option="--model-path")


def eval_lines(solved: dict[tuple[int, str], set[int]], tasks: range) -> str:
    """Eval episodes as a run writes them, per ``{(step, label): tasks solved}`` over ``tasks``."""
    from agentgym import Trajectory, Turn
    from agentgym._trajectory import to_json_line

    lines = []
    for (step, label), wins in solved.items():
        for task in tasks:
            tool = [{"role": "tool", "content": "42"}] if task in wins else []  # else a guess
            episode = Trajectory(
                env_id="agentgym/Calculator-v0", task_index=task, task_position=task,
                messages=[{"role": "user", "content": "?"}, *tool], turns=[Turn(), Turn()],
                final_reward=1.0, info={"step": step, "eval": label},
            )  # fmt: skip
            lines.append(to_json_line(episode))
    return "".join(lines)


def test_best_exports_the_checkpoint_whose_eval_did_best_on_the_tasks_all_played(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Periodic evals played tasks 0-3, the final one 0-7: steps are compared on 0-3."""
    from agentgym.trainers import export_run

    run_dir = write_run(tmp_path, tiny_model_dir, {2: 0, 4: 1, 6: 2})
    evals = run_dir / "eval_trajectories.jsonl"
    evals.write_text(
        eval_lines({(0, "eval"): set(), (2, "eval"): {0, 1}, (4, "eval"): {0, 1, 2},
                    (5, "eval"): {0, 1, 2, 3}}, range(4))  # step 5 has no checkpoint
        + eval_lines({(6, "final"): {0, 1, 4, 5, 6, 7}}, range(8))
        + '{"env_id": "agentg'  # a live run's half-written line
    )  # fmt: skip
    best = export_run(run_dir, tmp_path / "best", best=True)
    info = json.loads((best / "export.json").read_text())
    assert info["step"] == 4 and info["chosen_by"] == "eval/success"
    assert info["eval_tasks"] == 4 and info["eval_success"] == {"2": 0.5, "4": 0.75, "6": 0.5}
    adapter = run_dir / "checkpoints" / "step-000004" / "adapter" / "adapter_model.safetensors"
    assert (best / "adapter_model.safetensors").read_bytes() == adapter.read_bytes()
    proc = agentgym_here("export", run_dir, tmp_path / "cli", "--best")
    assert proc.returncode == 0, proc.stderr
    assert "on 4 held-out tasks: 2: 50.0%, 4: 75.0%, 6: 50.0%" in proc.stdout
    assert "at step 4 written to" in proc.stdout
    evals.write_text(eval_lines({(4, "eval"): {0}, (6, "final"): {0}}, range(2)))
    tie = export_run(run_dir, tmp_path / "tie", best=True)
    assert json.loads((tie / "export.json").read_text())["step"] == 6  # a tie: the later step


def test_best_without_an_evaluated_checkpoint_says_how_to_get_one(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from agentgym.trainers import export_run

    run_dir = write_run(tmp_path, tiny_model_dir, {2: 0, 4: 1})
    (run_dir / "eval_trajectories.jsonl").write_text(eval_lines({(3, "eval"): {0}}, range(2)))
    with pytest.raises(ConfigError, match=r"no kept checkpoint \(steps 2, 4\) was evaluated; "
                                          "pass --step, or train with eval_steps dividing"):
        export_run(run_dir, tmp_path / "out", best=True)
    (run_dir / "eval_trajectories.jsonl").write_text(
        eval_lines({(2, "eval"): {0}}, range(2)) + eval_lines({(4, "eval"): {2}}, range(2, 4))
    )
    with pytest.raises(ConfigError, match="evals of steps 2, 4 played no task in common"):
        export_run(run_dir, tmp_path / "out", best=True)
    with pytest.raises(ConfigError, match=r"by step \(2\) or by its eval \(best\), not both"):
        export_run(run_dir, tmp_path / "out", step=2, best=True)
    assert not (tmp_path / "out").exists()


def test_a_base_model_the_adapter_does_not_fit_or_without_a_vocabulary_is_refused(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """``--base-model`` of another width exported with a ``vllm serve`` line for a model the
    adapter does not fit (and ``--merge`` failed with PEFT's traceback); a base folder without
    its tokenizer files merged into a folder whose tokenizer turned any text into nothing."""
    from agentgym.engine.tiny import build_tiny_model
    from agentgym.trainers import export_run

    run_dir = write_run(tmp_path, tiny_model_dir, {2: 0})
    other = build_tiny_model(tmp_path / "other", hidden_size=256, num_heads=4)
    for merge in (False, True):
        with pytest.raises(ConfigError, match="does not fit the model in .*other"):
            export_run(run_dir, tmp_path / "out", merge=merge, base_model=other)
    bare = Path(shutil.copytree(tiny_model_dir, tmp_path / "bare"))
    (bare / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match="vocabulary is missing|cannot load a tokenizer"):
        export_run(run_dir, tmp_path / "out", merge=True, base_model=bare)
    assert not (tmp_path / "out").exists()


@pytest.mark.vllm
@pytest.mark.engine
def test_the_merged_model_serves_in_vllm_what_the_adapter_does_on_its_base(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The merged folder is what ``vllm serve OUT`` loads: vLLM's greedy tokens from it are
    transformers' greedy tokens from the base with the adapter, and the base is untouched."""
    require("vllm")
    torch = require("torch")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agentgym.engine import VLLMPolicy

    run_dir = write_run(tmp_path, tiny_model_dir, {3: 7})
    before = digest(tiny_model_dir)
    # in this process: a new one spent seconds importing torch, transformers and peft again,
    # in the engine group that one worker runs alone
    proc = agentgym_here("export", run_dir, tmp_path / "merged", "--merge")
    assert proc.returncode == 0, proc.stderr
    merged = tmp_path / "merged"
    assert f"serve it: vllm serve {merged}" in proc.stdout
    assert digest(tiny_model_dir) == before
    assert (merged / "tokenizer_config.json").is_file() and (merged / "export.json").is_file()
    assert not (merged / "adapter_config.json").exists()  # plain weights, no LoRA needed

    adapter = run_dir / "checkpoints" / "step-000003" / "adapter"
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(torch.tensor([PROMPT])).logits
        tuned = PeftModel.from_pretrained(base, adapter).eval()
        tuned_logits = tuned(torch.tensor([PROMPT])).logits
        want = tuned.generate(torch.tensor([PROMPT]), max_new_tokens=8,
                              do_sample=False)[0, len(PROMPT):].tolist()  # fmt: skip
        plain = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
        merged_logits = plain(torch.tensor([PROMPT])).logits
    assert (tuned_logits - base_logits).abs().max() > 1e-2  # the adapter changes the model
    assert torch.allclose(merged_logits, tuned_logits, atol=1e-4)  # fp32 merge: rounding only
    with VLLMPolicy(merged, sampling={"temperature": 0.0, "max_tokens": 8}, dtype="float32",
                    max_model_len=256) as policy:  # fmt: skip
        served = asyncio.run(policy.generate_ids(PROMPT)).completion_ids
    assert served == want and len(want) > 1, (served, want)
