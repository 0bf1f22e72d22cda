"""GRPOTrainer end to end on the real stack: tiny local model, vLLM CPU engine, peft LoRA.

Runs are kept tiny (2 tasks x G=2, short turns): they prove wiring and invariants (adapter
changes, base weights untouched, the served version is the one trained, kill -9 + resume),
not learning; `make quickstart` shows learning.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import yaml

import agentgym
from agentgym import Trajectory, Turn
from agentgym.trainers import GRPOConfig
from agentgym.trainers._run_dir import read_jsonl_records
from tests.conftest import TINY_RUN, agentgym_ok, require
from tests.trainers.killing import kill_when

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]


def config(tmp_path: Path, **changes) -> GRPOConfig:
    return GRPOConfig.from_dict({**TINY_RUN, "output_dir": str(tmp_path / "run"), **changes})


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def metrics(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def train_lines(run: Path) -> list[dict]:
    """The training steps' lines of ``metrics.jsonl`` (not the eval lines)."""
    return [m for m in read_jsonl_records(run / "metrics.jsonl") if "data/tasks" in m]


def text_length(completion: str) -> float:
    """A reward a random model's samples differ on, so every group has a learning signal."""
    return len(completion) / 24


class ChatterEnv(agentgym.ToolEnv):
    """One turn, no tools: the reward is the reply's length.

    ``made`` lists every instance; each counts its resets and notes its close.
    """

    made: list[ChatterEnv] = []

    def __init__(self, num_tasks: int = 40, **kwargs) -> None:
        tasks = [{"prompt": f"Say something ({i})."} for i in range(num_tasks)]
        super().__init__([], tasks=tasks, rubric=agentgym.Rubric([text_length]), **kwargs)
        self.resets, self.closed = 0, False
        ChatterEnv.made.append(self)

    async def areset(self, *, seed=None, options=None):
        self.resets += 1
        return await super().areset(seed=seed, options=options)

    async def aclose(self) -> None:
        self.closed = True
        await super().aclose()


agentgym.register("test/Chatter-v0", ChatterEnv)


@pytest.mark.parametrize("engine", ["vllm", "vllm-compiled", "hf"])
def test_steps_train_the_adapter_only_and_each_step_serves_the_new_version(
    tmp_path, engine: str
) -> None:
    if engine.startswith("vllm"):
        require("vllm")
    from agentgym.trainers import GRPOTrainer

    cfg = config(
        tmp_path, env="test/Chatter-v0", max_steps=2, eval_steps=None, save_steps=None,
        rollout_engine=engine.split("-")[0], rollout_compile=engine == "vllm-compiled",
        train_tasks=None, eval_tasks=None,  # the split: eval 0-3
        report_to=["tensorboard"],
    )  # fmt: skip
    trainer = GRPOTrainer(cfg)
    base = trainer.model_dir / "model.safetensors"
    before = digest(base)
    ChatterEnv.made.clear()
    figures = trainer.train()
    run = Path(cfg.output_dir)
    assert digest(base) == before  # never merged into the base weights
    steps = [m for m in metrics(run) if "sync/adapter_version" in m]
    # v1 is the initial adapter; step s trains and serves v(s+1), checked against the engine
    assert [m["sync/adapter_version"] for m in steps] == [2.0, 3.0]
    # the engine sampled with the weights the trainer scores: step 2 ran v2, trained at lr 1e-2
    assert max(m["sampling/logprob_drift_max"] for m in steps) < 5e-3
    from safetensors.torch import load_file

    v1, v3 = (load_file(run / "adapters" / f"v{v}" / "adapter_model.safetensors") for v in (1, 3))
    changed = [k for k in v1 if not (v1[k] == v3[k]).all()]
    assert changed and all("lora_" in k for k in v1)
    assert 0.0 <= figures["grpo/success"] <= 1.0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()  # the evals with lines of their own reach the trackers too
    assert [(e.step, e.value) for e in events.Scalars("eval/success")] == [
        (0, pytest.approx(figures["base/success"]))
    ]
    assert [(e.step, e.value) for e in events.Scalars("final/success")] == [
        (2, pytest.approx(figures["grpo/success"]))
    ]
    assert (run / "reward_curve.png").stat().st_size > 1000
    evals = [
        json.loads(line) for line in (run / "eval_trajectories.jsonl").read_text().splitlines()
    ]
    assert [t["task_index"] for t in evals] == [0, 1, 2, 3] * 2  # before, after; held out
    # the reference episode that picks the rollout mode on an env of its own, then 16
    # episodes (eval 4, two steps of 2 tasks x 2, eval 4) on the run's pool of 4 envs
    played = sorted(env.resets for env in ChatterEnv.made if env.resets)
    assert played[0] == 1 and sum(played[1:]) == 16 and len(played) <= 1 + 4
    assert all(env.closed for env in ChatterEnv.made)


def test_max_staleness_1_rolls_out_the_next_step_during_the_update(tmp_path, monkeypatch) -> None:
    require("vllm")
    import torch

    from agentgym.trainers import GRPOTrainer

    # a rendezvous: step k's update waits for step k+1's rollouts to start, and they wait for
    # it to start; run one after the other (max_staleness 0), the update would wait in vain
    updating = {k: threading.Event() for k in (1, 2, 3)}
    collecting = {k: threading.Event() for k in (1, 2, 3, 4)}
    update, collect = GRPOTrainer._update, GRPOTrainer._collect
    updates = iter((1, 2, 3))
    threads, torch_threads, set_threads = {}, torch.get_num_threads(), torch.set_num_threads
    counts_set: list[int] = []

    def rendezvous_update(self, *args):
        step = next(updates)
        threads[step] = torch.get_num_threads()
        updating[step].set()
        if step < 3:  # the last step has nothing to roll out next
            assert collecting[step + 1].wait(60), f"step {step + 1} did not roll out meanwhile"
        return update(self, *args)

    async def rendezvous_collect(self, policy, step, version):
        collecting[step].set()
        if step > 1:
            assert await asyncio.to_thread(updating[step - 1].wait, 60)
        return await collect(self, policy, step, version)

    monkeypatch.setattr(GRPOTrainer, "_update", rendezvous_update)
    monkeypatch.setattr(GRPOTrainer, "_collect", rendezvous_collect)
    cfg = config(
        tmp_path, env="test/Chatter-v0", max_steps=3, eval_steps=None, save_steps=None,
        train_tasks=None, eval_tasks=None, max_staleness=1,
    )  # fmt: skip
    trainer = GRPOTrainer(cfg)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (counts_set.append(n), set_threads(n)))
    trainer.train()
    steps = [m for m in metrics(Path(cfg.output_dir)) if "sync/adapter_version" in m]
    assert [m["sync/adapter_version"] for m in steps] == [2.0, 3.0, 4.0]
    # step 1 rolled out on v1 and trained it; steps 2 and 3 rolled out on v1 and v2 while
    # the step before trained, so each trained one version past the one that sampled it
    assert [m["rollout/staleness"] for m in steps] == [0.0, 1.0, 1.0]
    assert not collecting[4].is_set()  # nothing rolled out past the last step
    # an update beside rollouts leaves a core to the engine on this CPU, then the training
    # thread's full count is restored (never the reduced one read back); the last runs alone
    fewer = max(1, torch_threads - 1)
    assert threads == {1: fewer, 2: fewer, 3: torch_threads}
    assert counts_set == [fewer, torch_threads, fewer, torch_threads]
    # step 1 waited for its whole rollout; steps 2 and 3 found theirs done during the update
    assert steps[0]["time/rollout_wait"] >= steps[0]["time/rollout"]
    assert all(m["time/rollout_wait"] < m["time/rollout"] for m in steps[1:])


def test_on_a_gpu_the_engine_takes_the_configured_share_and_leaves_the_rest(
    tmp_path, monkeypatch
) -> None:
    """vLLM's default (0.9 of the GPU) would starve the trainer on the same GPU.

    No GPU here: the trainer is told its device is CUDA and the engine (lazy) is not started;
    what is checked is what it would be started with.
    """
    from agentgym.trainers import GRPOTrainer

    trainer = GRPOTrainer(config(tmp_path, vllm_gpu_memory_utilization=0.25,
                                 rollout_compile=True))  # fmt: skip
    on_cpu = trainer._in_process_engine(trainer.model_dir, {}, lora=True, rollout_mode="auto")
    assert "gpu_memory_utilization" not in on_cpu._engine_args  # the CPU build sizes its own
    assert on_cpu._engine_args["enforce_eager"] is False  # rollout_compile
    monkeypatch.setattr(trainer, "_device", lambda: "cuda")
    on_gpu = trainer._in_process_engine(trainer.model_dir, {}, lora=False, rollout_mode="auto")
    assert on_gpu._engine_args["gpu_memory_utilization"] == 0.25
    assert on_gpu._engine_args["dtype"] == "bfloat16"


def test_check_versions_refuses_turns_of_another_adapter() -> None:
    from agentgym.trainers._grpo import StaleAdapterError, check_versions

    fresh = Trajectory(env_id="x", turns=[Turn(adapter_version=3)])
    check_versions([fresh], 3)
    stale = Trajectory(env_id="x", turns=[Turn(adapter_version=3), Turn(adapter_version=2)])
    with pytest.raises(StaleAdapterError, match="refusing"):
        check_versions([fresh, stale], 3)


def test_kill_9_then_resume_continues_at_the_right_step_with_the_same_data(tmp_path) -> None:
    """Killed once step 3's line and its eval's episodes are written, its checkpoint never
    (checkpoints every 2 steps): the resume goes back to step 2's checkpoint, moves step 3's
    line and episodes aside and plays it again, so each is there once, in the data order of a
    run never killed, and nothing a cut-short write began is left behind."""
    require("vllm")
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            {**TINY_RUN, "output_dir": str(tmp_path / "run"), "max_steps": 4, "save_steps": 2,
             "eval_steps": 3, "eval_num_tasks": 2, "lr_scheduler_type": "linear",
             "log_completions": True,
             # adaptive entropy control, its target above any entropy: +0.01 every step
             "use_adaptive_entropy": True, "entropy_target": 100.0, "entropy_coef_delta": 0.01}
        )
    )  # fmt: skip
    agentgym = [str(Path(sys.executable).with_name("agentgym")), "train", str(cfg_path)]
    run = tmp_path / "run"
    proc = subprocess.Popen(agentgym, start_new_session=True)
    kill_when(proc, lambda: 3 in [m["step"] for m in train_lines(run)], "step 3's line",
              timeout=600)  # fmt: skip
    latest = max((run / "checkpoints").glob("step-*"))
    assert latest.name == "step-000002"  # step 3's line is written, its checkpoint never is
    killed_at = json.loads((latest / "trainer_state.json").read_text())
    checkpointed = digest(latest / "adapter" / "adapter_model.safetensors")
    # the resume in this process: the killed run's process is the one that matters here
    agentgym_ok("train", cfg_path, "--resume")
    steps = train_lines(run)
    assert [m["step"] for m in steps] == [1, 2, 3, 4]  # each once: the replayed one moved aside
    rolled_back = read_jsonl_records(run / "metrics.rolled_back.jsonl")
    assert [m["step"] for m in rolled_back if "data/tasks" in m] == [3]
    evals = Counter((r["info"]["step"], r["info"]["eval"])
                    for r in read_jsonl_records(run / "eval_trajectories.jsonl"))  # fmt: skip
    assert evals == {(0, "eval"): 4, (3, "eval"): 2, (4, "final"): 4}  # none doubled
    from agentgym.trainers import GRPOTrainer

    trainer = GRPOTrainer(GRPOConfig.from_yaml(cfg_path))
    assert [m["data/tasks"] for m in steps] == [trainer._tasks_for(s) for s in (1, 2, 3, 4)]
    # the schedule is a function of the step: the resumed steps carry on the decay
    rates = [trainer.config.learning_rate_at(s) for s in (1, 2, 3, 4)]
    assert [m["train/learning_rate"] for m in steps] == rates
    assert rates == sorted(rates, reverse=True) and len(set(rates)) == 4  # it did decay
    # the checkpoint kept the entropy controller: the resumed step applied what it had reached
    # (a fresh controller applies no bonus until it has measured a step)
    applied = [m["loss/entropy_coef"] for m in steps]
    assert applied == pytest.approx([0.0, 0.01, 0.02, 0.03])
    # the resumed engine first serves the checkpoint's adapter, as the next version number
    resumed_version = killed_at["adapter_version"] + 1
    served = digest(run / "adapters" / f"v{resumed_version}" / "adapter_model.safetensors")
    assert served == checkpointed
    state = json.loads((run / "checkpoints" / "step-000004" / "trainer_state.json").read_text())
    assert state["step"] == 4
    assert state["adapter_version"] == resumed_version + (4 - killed_at["step"])
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["previous"]["state"] == "killed"
    # log_completions: each step's episodes once (a replayed step's rolled back), its tasks
    rollouts = read_jsonl_records(run / "rollouts.jsonl")
    assert [r["info"]["step"] for r in rollouts] == [s for s in (1, 2, 3, 4) for _ in range(4)]
    for r in rollouts:
        assert r["task_index"] in steps[r["info"]["step"] - 1]["data/tasks"] and r["messages"]
    # the checkpoints of save_steps and of the last step; none of the killed step 3
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-000002", "step-000004"
    ]
    left = [p.name for p in run.rglob("*") if ".tmp" in p.name or p.name.startswith(".old-")]
    assert left == []
