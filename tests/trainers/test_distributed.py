"""Training on several processes, on the real stack: torchrun, gloo, peft LoRA, the tiny model.

- Two ranks' update equals one process's update on the union of their samples, and leaves the
  same adapter on both ranks (the trainer's own `_update` on fixed synthetic samples).
- ``torchrun ... agentgym train`` end to end: both ranks roll out their share, rank 0 records
  whole steps, ``--resume`` continues.
- Launches refused in one line: a ``tasks_per_step`` the ranks cannot share, and
  ``accelerate launch`` on a CPU (it runs one process whatever ``--num_processes`` says).

No GPU here: the nccl path is not exercised. Run as a module under torchrun
(``python -m tests.trainers.test_distributed OUT``), this file is the rank program of the
first test.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentgym._errors import ConfigError
from agentgym.trainers import GRPOConfig, Sample
from tests.conftest import TINY_RUN, require

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TORCHRUN = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2"]
#: One KV-cache GiB per engine: two engines share this machine.
ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}

#: Shorter turns and evals than `TINY_RUN`'s: two processes share two cores.
TINY = {**TINY_RUN, "eval_tasks": "0:2", "max_completion_length": 16}
#: Update variants: config changes, and how many of the 5 samples rank 0 holds (rank 1 the
#: rest). Gradient norms unclipped except in "clipped", so a wrong gradient scale shows.
VARIANTS: dict[str, tuple[dict[str, Any], int]] = {
    "dapo": ({"loss_type": "dapo", "max_grad_norm": None}, 3),
    "grpo": ({"loss_type": "grpo", "max_grad_norm": None}, 3),
    "dr_grpo": ({"loss_type": "dr_grpo", "max_grad_norm": None}, 1),
    "clipped": ({"loss_type": "dapo", "max_grad_norm": 0.5}, 2),
    "rank_1_empty": ({"loss_type": "dapo", "max_grad_norm": None}, 5),
}


def update_config(out: Path, changes: dict[str, Any]) -> GRPOConfig:
    """Two micro-batches and two iterations per step: accumulation and reuse are exercised."""
    return GRPOConfig.from_dict({
        **TINY, "output_dir": str(out / "unused"), "gradient_accumulation_steps": 2,
        "num_iterations": 2, **changes,
    })  # fmt: skip


def synthetic_samples() -> list[Sample]:
    """Five samples of different lengths, advantages and engine logprobs (seeded)."""
    rng = random.Random(0)
    samples = []
    for episode in range(5):
        prompt, completion = rng.randint(3, 9), rng.randint(2, 7)
        engine = [None] * prompt + [rng.uniform(-4.0, -1.0) for _ in range(completion)]
        samples.append(Sample(
            input_ids=[rng.randrange(256) for _ in range(prompt + completion)],
            loss_mask=[0] * prompt + [1] * completion, engine_logprobs=engine,
            advantage=rng.uniform(-1.5, 1.5), episode=episode,
        ))  # fmt: skip
    return samples


def update_once(trainer: Any, samples: list[Sample]) -> dict[str, Any]:
    """The trainer's own `_update` from its seeded fresh adapter: LoRA weights and gradients."""
    from agentgym.trainers import LossSpec

    model, optimizer = trainer._trainable(trainer.model_dir)
    spec = LossSpec.from_config(trainer.config, max_turns=trainer.env_max_turns)
    trainer._update(model, optimizer, samples, spec)
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    weights = {name: p.detach().clone() for name, p in trained}
    return weights | {f"grad/{name}": p.grad.detach().clone() for name, p in trained}


def rank_main(out: Path) -> None:
    """One rank of the first test: each variant's update on this rank's share, saved."""
    from safetensors.torch import save_file

    from agentgym.trainers import GRPOTrainer
    from agentgym.trainers._distributed import World

    samples, world = synthetic_samples(), World.from_env()
    with world.joined("cpu"):
        for name, (changes, split) in VARIANTS.items():
            share = samples[:split] if world.rank == 0 else samples[split:]
            state = update_once(GRPOTrainer(update_config(out, changes)), share)
            save_file(state, str(out / f"{name}-rank{world.rank}.safetensors"))


def torchrun(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    # its logs in a folder removed after it: by default torchrun makes a torchelastic_* folder
    # in the temp dir for each launch and leaves it there
    with tempfile.TemporaryDirectory(prefix="torchrun-logs-") as logs:
        return subprocess.run([*TORCHRUN, "--log-dir", logs, *args], cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip


def train(cfg_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node 2 --no-python agentgym train CFG``: the documented command."""
    return torchrun("--no-python", str(BIN / "agentgym"), "train", str(cfg_path), *options,
                    timeout=600)  # fmt: skip


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


def step_lines(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if "data/tasks" in m]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_config(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**TINY, "output_dir": str(tmp_path / "run"), **changes}))
    return path


# ---- the update ------------------------------------------------------------------------------


def distance(a: dict[str, Any], b: dict[str, Any], keys: list[str]) -> float:
    return sum(float(((a[k] - b[k]) ** 2).sum()) for k in keys) ** 0.5


@pytest.mark.slow
def test_two_ranks_make_the_one_process_update_on_the_union_of_their_samples(tmp_path) -> None:
    """Gradients are compared entry by entry, the update as a whole: Adam divides by sqrt(v),
    so float32 summation-order noise in near-zero gradient entries is magnified in those
    weights (measured: 1e-6 to 4e-5 of the update's norm)."""
    torch = require("torch")
    require("peft")
    from safetensors.torch import load_file

    from agentgym.trainers import GRPOTrainer

    proc = torchrun("-m", "tests.trainers.test_distributed", str(tmp_path), timeout=300)
    assert proc.returncode == 0, output(proc)[-3000:]
    samples = synthetic_samples()
    for name, (changes, split) in VARIANTS.items():
        rank0, rank1 = (load_file(tmp_path / f"{name}-rank{r}.safetensors") for r in (0, 1))
        assert all(torch.equal(rank0[k], rank1[k]) for k in rank0), f"{name}: ranks differ"
        trainer = GRPOTrainer(update_config(tmp_path, changes))
        union = update_once(trainer, samples)
        fresh, _ = trainer._trainable(trainer.model_dir)
        start = {k: p.detach() for k, p in fresh.named_parameters() if p.requires_grad}
        weights = list(start)
        for key in (k for k in union if k.startswith("grad/")):  # the last update's gradient
            where = f"{name} {key}"
            torch.testing.assert_close(rank0[key], union[key], rtol=1e-4, atol=1e-7,
                                       msg=lambda m, where=where: f"{where}: {m}")  # fmt: skip
        update = distance(union, start, weights)
        assert update > 1e-2  # the step moved the adapter
        assert distance(rank0, union, weights) < 1e-3 * update, name
        if split < len(samples):  # a rank's share alone makes a far other update
            alone = update_once(trainer, samples[:split])
            assert distance(alone, union, weights) > 0.1 * update, name


@pytest.mark.slow
def test_a_micro_batch_token_cap_leaves_the_update_unchanged(tmp_path) -> None:
    """Five samples in one pass vs one or two per pass (a 16-token cap): the same gradient."""
    torch = require("torch")
    require("peft")
    from agentgym.trainers import GRPOTrainer

    samples = synthetic_samples()
    changes = {"loss_type": "grpo", "max_grad_norm": None, "gradient_accumulation_steps": 1}
    whole = update_once(GRPOTrainer(update_config(tmp_path, changes)), samples)
    capped_trainer = GRPOTrainer(update_config(tmp_path, {**changes, "micro_batch_tokens": 16}))
    capped = update_once(capped_trainer, samples)
    for key in (k for k in whole if k.startswith("grad/")):
        torch.testing.assert_close(capped[key], whole[key], rtol=1e-4, atol=1e-7)
    model, _ = capped_trainer._trainable(capped_trainer.model_dir)
    parts = capped_trainer._micro_batches(model, samples)
    assert len(parts) >= 3
    assert all(part.input_ids.numel() <= 16 or len(part.input_ids) == 1 for part in parts)
    assert len(GRPOTrainer(update_config(tmp_path, changes))._micro_batches(model, samples)) == 1


@pytest.mark.slow
def test_a_long_episode_trains_in_its_own_pass_and_the_update_is_unchanged(
    tmp_path, monkeypatch
) -> None:
    """Four short rows and one long, after a shared prompt: two passes, the one-pass gradient.

    One pass would pad the short rows to the long one's width (5 x 205 suffix tokens); two
    passes compute the prompt twice and pad nothing (4 x 5 + 205).
    """
    torch = require("torch")
    require("peft")
    from agentgym.trainers import GRPOTrainer, _samples

    rng = random.Random(1)
    prompt = [rng.randrange(256) for _ in range(40)]
    samples = [
        Sample(input_ids=prompt + [rng.randrange(256) for _ in range(n)],
               loss_mask=[0] * len(prompt) + [1] * n, engine_logprobs=[None] * (len(prompt) + n),
               advantage=rng.uniform(-1.5, 1.5), episode=episode)
        for episode, n in enumerate((5, 5, 205, 5, 5))
    ]  # fmt: skip
    changes = {"loss_type": "grpo", "max_grad_norm": None, "gradient_accumulation_steps": 1,
               "device": "cpu"}  # fmt: skip
    trainer = GRPOTrainer(update_config(tmp_path, changes))
    model, _ = trainer._trainable(trainer.model_dir)
    widths = [tuple(part.input_ids.shape) for part in trainer._micro_batches(model, samples)]
    assert widths == [(4, 45), (1, 245)]
    split = update_once(trainer, samples)
    monkeypatch.setitem(_samples.PASS_COST_TOKENS, "cpu", 10**9)  # a pass costs too much to cut
    assert len(trainer._micro_batches(model, samples)) == 1
    whole = update_once(trainer, samples)
    for key in (k for k in whole if k.startswith("grad/")):
        torch.testing.assert_close(split[key], whole[key], rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_gradient_checkpointing_recomputes_the_layers_and_leaves_the_update_unchanged(
    tmp_path, monkeypatch
) -> None:
    torch = require("torch")
    require("peft")
    from agentgym.trainers import GRPOTrainer, LossSpec

    def update(checkpointing: bool) -> tuple[dict[str, Any], int]:
        changes = {"loss_type": "dapo", "max_grad_norm": None, "gradient_accumulation_steps": 1,
                   "gradient_checkpointing": checkpointing}  # fmt: skip
        trainer = GRPOTrainer(update_config(tmp_path, changes))
        model, optimizer = trainer._trainable(trainer.model_dir)
        forwards: list[int] = []
        layer_class = type(model.get_base_model().model.layers[0])
        forward = layer_class.forward  # counted in the class: hooks skip the recomputation

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            forwards.append(1)
            return forward(self, *args, **kwargs)

        monkeypatch.setattr(layer_class, "forward", counted)
        trainer._update(model, optimizer, synthetic_samples(),
                        LossSpec.from_config(trainer.config, max_turns=trainer.env_max_turns))
        monkeypatch.setattr(layer_class, "forward", forward)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return grads, len(forwards)

    plain, plain_forwards = update(False)
    checkpointed, checkpointed_forwards = update(True)
    assert checkpointed_forwards == 2 * plain_forwards  # each layer ran again in backward
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-4, atol=1e-7)


# ---- end to end ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.engine
def test_torchrun_train_shards_each_step_and_resumes(tmp_path) -> None:
    require("vllm")
    from agentgym.trainers import GRPOTrainer

    # max_staleness 1: each rank's update (and its collectives) runs in a thread while that
    # rank rolls out the next step
    cfg_path = write_config(tmp_path, max_steps=2, save_steps=1, eval_steps=None,
                            max_staleness=1)  # fmt: skip
    run = tmp_path / "run"
    first = train(cfg_path)
    assert first.returncode == 0, output(first)[-4000:]
    assert all(f"rank {r} of 2 joined (gloo)" in output(first) for r in (0, 1))
    trainer = GRPOTrainer(GRPOConfig.from_yaml(cfg_path))  # one process: for the data order
    steps = step_lines(run)
    assert [m["step"] for m in steps] == [1, 2]  # one line per step: rank 0 alone writes
    assert [m["data/tasks"] for m in steps] == [trainer._tasks_for(s) for s in (1, 2)]
    assert [m["rollout/episodes"] for m in steps] == [4.0, 4.0]  # both ranks' 2 x G=2 episodes
    assert [m["sync/adapter_version"] for m in steps] == [2.0, 3.0]  # checked on each rank
    assert [m["rollout/staleness"] for m in steps] == [0.0, 1.0]  # step 2 rolled out on v1
    checkpointed = digest(run / "checkpoints/step-000002/adapter/adapter_model.safetensors")

    second = train(cfg_path, "--resume", "--set", "max_steps=3")
    assert second.returncode == 0, output(second)[-4000:]
    steps = step_lines(run)
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert steps[2]["data/tasks"] == trainer._tasks_for(3)
    assert steps[2]["rollout/episodes"] == 4.0
    assert steps[2]["rollout/staleness"] == 0.0  # a resumed run rolls its first step out fresh
    # every rank's engine first serves the checkpoint's adapter, as the next version (v4)
    assert digest(run / "adapters/v4/adapter_model.safetensors") == checkpointed
    state = json.loads((run / "checkpoints/step-000003/trainer_state.json").read_text())
    assert state == {"step": 3, "adapter_version": 5}


# ---- launches refused ------------------------------------------------------------------------

TORCHRUN_ENV = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500"}  # fmt: skip


def test_torchrun_variables_describe_the_world() -> None:
    from agentgym.trainers._distributed import World

    assert World.from_env({}) == World(rank=0, world_size=1, local_rank=0)
    assert World.from_env(TORCHRUN_ENV) == World(rank=1, world_size=2, local_rank=1)
    assert World.from_env({**TORCHRUN_ENV, "WORLD_SIZE": "1", "RANK": "0"}).world_size == 1
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        World.from_env({k: v for k, v in TORCHRUN_ENV.items() if k != "MASTER_ADDR"})
    with pytest.raises(ConfigError, match="accelerate launch.*ONE process.*torchrun"):
        World.from_env({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"})


def test_tasks_per_step_must_divide_among_the_ranks_before_a_model_loads(monkeypatch) -> None:
    require("torch")
    from agentgym.trainers import GRPOTrainer

    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    cfg = GRPOConfig.from_dict({**TINY, "model": "/nonexistent", "tasks_per_step": 3})
    with pytest.raises(ConfigError, match="tasks_per_step=3 cannot be split equally among the 2"):
        GRPOTrainer(cfg)  # a model that does not exist: the check comes first


@pytest.mark.slow
def test_launches_that_cannot_work_end_in_one_line(tmp_path) -> None:
    require("accelerate")
    cfg_path = write_config(tmp_path, tasks_per_step=3)
    refused = torchrun("--no-python", str(BIN / "agentgym"), "train", str(cfg_path), timeout=300)
    assert refused.returncode != 0
    assert "error: tasks_per_step=3 cannot be split equally among the 2 training processes (" \
        in refused.stderr  # fmt: skip
    accelerate = [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2"]
    trapped = subprocess.run([*accelerate, str(BIN / "agentgym"), "train", str(cfg_path)],
                             env=ENV, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert trapped.returncode != 0
    line = next(x for x in trapped.stderr.splitlines() if x.startswith("error:"))
    assert "ONE process" in line and "torchrun --standalone --nproc_per_node N" in line
    assert not (tmp_path / "run").exists()  # refused before anything was written


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]))
