"""`GRPOTrainer`: multi-turn GRPO + LoRA on vLLM rollouts, top to bottom.

One step, in run order (each stage is one call below)::

    tasks (seeded order) -> rollouts (vLLM, G per task, token-exact) -> check adapter versions
      -> group advantages (infra_error / late dropped) -> samples (concat | per_turn)
      -> loss + optimiser step (LoRA only) -> adapter sync (new version into the engine)
      -> metrics, eval, checkpoint

With ``max_staleness`` 1 the next step's rollouts run during the update (one version behind;
`GRPOTrainer._update_while_collecting`).

The engine is in process (`VLLMPolicy`; `HFPolicy` with ``rollout_engine: hf`` where vLLM is
missing) or, with ``rollout_servers``, N vLLM servers (`RemoteVLLMPolicy`). All keep the same
token-in/token-out contract, and each sync loads (or publishes) the adapter as a new version.

Under torchrun (`_distributed.World`) each process rolls out whole groups of its share of the
step's tasks on its own engine; advantages and episode metrics are computed over every rank's
episodes, gradients are summed over the ranks, and rank 0 alone writes the run folder and
evaluates. One process runs the same loop with identity collectives.

Why our own loop rather than TRL's `GRPOTrainer` with a `rollout_func`: with its own engine
off (`use_vllm=False`), TRL 1.16 drops the importance-sampling correction, returns one row per
trajectory (no per-turn samples) and never pushes adapters; with it on, it merges the LoRA
into base weights and streams them every step. We reuse what serves (PEFT for LoRA, TRL's loss
definitions, which `tests/trainers/test_loss.py` checks ours against) and own the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from agentgym import EnvPool, Trajectory, arollout
from agentgym._errors import ConfigError, Error, InfraError
from agentgym._own_loop import own_loop, run_caught, settle
from agentgym.engine import HFPolicy, RemoteVLLMPolicy, VLLMPolicy
from agentgym.engine._episode import ModeChoice
from agentgym.engine._fleet import run_namespace
from agentgym.engine._vllm import unguarded_script
from agentgym.runs._folder import SFT_SUMMARY
from agentgym.sandboxes._env import close_shared_pools, shared_pool_metrics

from ._advantages import Advantages, group_key, mask_truncated, trajectory_advantages
from ._config import GRPOConfig
from ._distributed import World
from ._entropy_control import EntropyControl
from ._health import HealthWatch
from ._loss import LossSpec, grpo_loss, token_entropy, token_logprobs
from ._memory import engine_beside_warm_start
from ._metrics import combine_metrics, episode_metrics, eval_metrics
from ._plan import reference_example
from ._prefix import MIN_SHARED_PREFIX, logits_to_keep, policy_logits
from ._preflight import preflight, resolved_device, rollout_fleet, warm_start_config
from ._report import plot_curves, read_warm_start, write_summary
from ._run_dir import WARM_START, RunDir, read_jsonl_records
from ._samples import (
    PASS_COST_TOKENS,
    Batch,
    build_samples,
    collate,
    micro_batches,
    rollout_mode_metrics,
    shared_prefix_length,
)
from ._sft import sft_warm_start
from ._tracking import Trackers, TrainingConsole
from ._training_state import load_training_state

log = logging.getLogger(__name__)
#: The engines a run rolls out on: in-process (vLLM or transformers), or vLLM servers.
RolloutPolicy = VLLMPolicy | HFPolicy | RemoteVLLMPolicy
#: Offset of replayed groups' episode seeds, past the steps' (`resample_zero_variance_groups`).
_REPLAY_SEEDS = 1 << 32
#: Per-rank step metrics that add up to the step's (the rest are averaged over the ranks,
#: weighted by their trained tokens).
#: ``loss/value`` adds up too: each rank's loss is divided by the whole step's counts.
_SUMMED_METRICS = frozenset({
    "train/samples", "train/tokens", "loss/value",
    "rollout/per_turn_episodes", "rollout/train_samples", "rollout/trained_tokens",
})  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Collected:
    """A step's episodes, with the adapter version that sampled them and how long they took."""

    trajectories: list[Trajectory]
    #: Train tasks that replaced flat groups (`resample_zero_variance_groups`).
    replayed: list[int]
    version: int
    seconds: float


class StaleAdapterError(Error):
    """Rollouts were sampled by another adapter version than the one just trained."""


class GRPOTrainer:
    """Train a LoRA adapter on an env with GRPO, rolling out on vLLM.

    Args:
        config: every knob (`GRPOConfig`); checked before anything loads.
        resume: continue the run in ``config.output_dir`` from its last checkpoint (same
            step count, optimiser, RNG state and data order; the engine serves the resumed
            adapter).

    Under torchrun every process builds one (``torchrun --nproc_per_node N --no-python
    agentgym train CONFIG``); ``tasks_per_step`` must divide by N.

    Example::

        config = GRPOConfig(env="calculator", max_steps=20, output_dir="runs/calc")
        figures = GRPOTrainer(config).train()
    """

    def __init__(self, config: GRPOConfig, *, resume: bool = False) -> None:
        self.config = config
        self.resume = resume
        self.world = World.from_env()
        self.world.check_divides("tasks_per_step", config.tasks_per_step)
        if config.device != "cpu":
            self.world.pin_gpu()  # before anything initialises CUDA
        checked = preflight(config)  # clear errors before any model loads
        self.model_dir = checked.model_dir
        #: Task indices trained on and held out (the config's, or the env's split).
        self.train_tasks, self.eval_tasks = checked.train_tasks, checked.eval_tasks
        #: The env's turn limit and tool schemas, read off the env preflight built.
        self.env_max_turns, self.tools = checked.env_max_turns, checked.tools
        self.tasks_sha256 = checked.tasks_sha256
        #: The warm start's conversations, played and checked by the pre-flight: played once.
        self._warm_start_traces = checked.warm_start_traces
        #: The rubric's weights, for GDPO advantages (`multi_objective_aggregation`).
        self.reward_weights = (checked.reward_weights
                               if config.multi_objective_aggregation == "normalize_then_sum"
                               else None)  # fmt: skip
        #: The run's event loop (`train` sets it) and the envs its rollouts reuse across steps.
        self._loop: asyncio.Runner | None = None
        self._envs = EnvPool(config.env, config.run_env_kwargs)
        #: Adaptive entropy control's state (`use_adaptive_entropy`), saved in checkpoints.
        self._entropy = EntropyControl.from_config(config)
        self._torch_threads = 1  # the training thread's torch thread count (`_train` reads it)

    # ---- the run ------------------------------------------------------------------------
    def train(self) -> dict[str, float]:
        """Run (or resume) training; returns the headline figures (eval success ...).

        Under torchrun every rank calls it; ranks other than 0 return ``{}``.
        """
        cfg = self.config
        done = (
            RunDir.finished_figures(cfg.output_dir, cfg.max_steps, cfg.to_dict(),
                                    GRPOConfig.defaults())  # fmt: skip
            if self.resume else None
        )  # fmt: skip
        if done is not None:
            log.warning("%s has finished (max_steps %d reached): nothing to resume",
                        cfg.output_dir, cfg.max_steps)  # fmt: skip
            return done if self.world.is_main else {}
        self._refuse_unguarded_script()  # before the run folder: a fixed script reruns as new
        with self.world.joined(self._device()), self._rollout_loop():
            if not self.world.is_main:
                return self._train(None, None)  # rank 0 owns the run folder and trackers
            run = RunDir(Path(cfg.output_dir), cfg.to_dict(), resume=self.resume,
                         keep=cfg.save_total_limit, defaults=GRPOConfig.defaults(),
                         tasks_sha256=self.tasks_sha256)  # fmt: skip
            trackers: Trackers | None = None
            try:  # a tracker that fails to start marks the run failed too, never left running
                # a folder reopened without a checkpoint replays from step 0: hide all of it
                replayed_after = run.resume_step if run.resumed else (-1 if run.reopened else None)
                trackers = Trackers(cfg.report_to, run.path, cfg.to_dict(),
                                    resume_step=replayed_after)  # fmt: skip
                figures = self._train(run, trackers)
            except BaseException as exc:
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):  # Ctrl-C, `kill PID`
                    log.warning("%s", _interrupted(run))
                    run.mark_interrupted(exc)
                else:
                    run.mark_failed(exc)
                raise
            finally:
                if trackers is not None:
                    trackers.close()
            run.mark_finished()
            return figures

    def _refuse_unguarded_script(self) -> None:
        """Refuse a script that starts the in-process vLLM engine without a ``__main__`` guard.

        vLLM's engine process (spawn) imports the script again, so the engine failed to start
        only after the run folder was made; the fixed script was then refused, the folder
        holding a failed run ("pass --resume"). The README asks for the guard in any script.
        """
        cfg = self.config
        if cfg.rollout_engine != "vllm" or cfg.rollout_servers:
            return
        script = unguarded_script()
        if script is not None:
            raise ConfigError(
                f"{script} trains without an `if __name__ == \"__main__\":` guard; vLLM's "
                "engine process imports the script again and would fail to start: move the "
                "code that calls train() under one"
            )

    @contextlib.contextmanager
    def _rollout_loop(self) -> Iterator[None]:
        """One event loop for the run's rollouts, so one `EnvPool` serves every step.

        The engine runs on a loop of its own; this one plays episodes. Envs are built once
        per concurrent episode for the whole run instead of once per episode, and closed
        when the run ends, with the sandbox containers they shared: a notebook's kernel kept
        a sandbox env's containers running after `train` returned, until it exited. The loop
        is `own_loop`'s and runs through `run_caught`: a Ctrl-C in env code neither cuts the
        close of the envs short nor leaves "Task exception was never retrieved", and an env's
        close stuck in a thread cannot hang the end of the run. After such a Ctrl-C, the step's
        other episodes close their envs (`settle`) before the pool's idle envs are closed.
        """
        with own_loop("train()") as loop:
            self._loop = loop
            try:
                yield
            except (KeyboardInterrupt, SystemExit):
                run_caught(loop, settle(self._envs.close_timeout))
                raise
            finally:
                run_caught(loop, self._envs.aclose())
                close_shared_pools()
                self._loop = None

    def _run(self, coro: Any) -> Any:
        """Run a coroutine from the (sync) training loop on the run's event loop (`run_caught`)."""
        assert self._loop is not None, "only inside train()"
        return run_caught(self._loop, coro)

    def _train(self, run: RunDir | None, trackers: Trackers | None) -> dict[str, float]:
        """The loop; ``run`` and ``trackers`` are None on ranks other than 0."""
        import torch

        cfg, world = self.config, self.world
        self._torch_threads = torch.get_num_threads()  # this thread's: the update's full count
        start = "sft/success" if cfg.sft_steps else "base/success"  # the step-0 eval's name
        figures: dict[str, float] = run.headline_figures(start) if run and run.resumed else {}
        namespace = world.broadcast(run_namespace(run.run_id) if run else None)
        with contextlib.ExitStack() as stack:
            policy, start_model = self._policy_and_start(stack, run, trackers, figures, namespace)
            model, optimizer = self._trainable(start_model)
            state: dict[str, Any] = {"step": 0}
            checkpoint = world.broadcast(run.latest_checkpoint() if run and run.resumed else None)
            if checkpoint is not None:  # the run folder was rolled back to it when it was opened
                state = load_training_state(checkpoint, model, optimizer)
                log.info("resumed from %s at step %d", checkpoint, state["step"])
                if self._entropy is not None:
                    self._entropy.restore(state["entropy_control"])
            spec = LossSpec.from_config(cfg, max_turns=self.env_max_turns)
            console = stack.enter_context(TrainingConsole(cfg.max_steps, start_step=state["step"]))
            self._decide_mode(policy)
            version = self._sync(policy, model, run, state.get("adapter_version", 0) + 1)
            if run and trackers and state["step"] == 0:
                figures[start] = self._headline_eval(policy, run, trackers, 0, "eval")
            health = HealthWatch(read_jsonl_records(run.metrics_path) if run else (),
                                 read_warm_start(run.path) if run else None)  # fmt: skip
            broken_steps = 0  # consecutive steps mostly infra_error, or with no episode scored
            ahead: Collected | None = None  # the next step's episodes (max_staleness 1)
            for step in range(state["step"] + 1, cfg.max_steps + 1):
                torch.manual_seed(cfg.seed * 100_003 + step)
                t0 = time.perf_counter()
                batch = ahead or self._run(self._collect(policy, step, version))
                trajectories, replayed = batch.trajectories, batch.replayed  # this rank's share
                t1 = time.perf_counter()
                check_versions(trajectories, batch.version)
                shares = world.gather([_without_token_ids(t) for t in trajectories])
                episodes = [t for share in shares for t in share]  # every rank's, in plan order
                broken_steps = broken_steps + 1 if _broken_step(episodes) else 0
                stop = _broken_stop(episodes, broken_steps, step, cfg.infra_error_patience)
                advantages, mine, masked = self._advantages(episodes, shares)
                samples = build_samples(trajectories, mine, cfg.rollout_mode)
                (train_metrics, train_seconds), ahead = self._learn(
                    model, optimizer, samples, spec, policy, step, version
                )  # fmt: skip
                t2 = time.perf_counter()
                version = self._sync(policy, model, run, version + 1)
                t3 = time.perf_counter()
                every_rank_replayed = (
                    [t for share in world.gather(replayed) for t in share]
                    if cfg.resample_zero_variance_groups else []
                )  # fmt: skip
                learned = combine_metrics(
                    [(share, share.get("train/tokens", 0.0)) for share in
                     world.gather({**rollout_mode_metrics(samples), **train_metrics})],
                    _SUMMED_METRICS,
                )  # fmt: skip
                if run is None or trackers is None:
                    if stop:
                        raise stop
                    continue  # rank 0 alone evaluates, logs and checkpoints
                metrics: dict[str, Any] = {
                    "data/tasks": self._tasks_for(step),
                    **({"data/replayed_tasks": every_rank_replayed} if every_rank_replayed else {}),
                    **episode_metrics(episodes),
                    **advantages.metrics(),
                    **({"rollout/masked_truncated_episodes": float(masked)}
                       if cfg.mask_truncated_completions else {}),  # fmt: skip
                    **learned,
                    "time/rollout": batch.seconds, "time/rollout_wait": t1 - t0,
                    "time/train": train_seconds, "time/sync": t3 - t2,
                    "time/step": t3 - t0, "rollout/staleness": float(version - 1 - batch.version),
                    "train/learning_rate": optimizer.param_groups[0]["lr"],  # as `_learn` set it
                    "sync/adapter_version": float(version),
                    "sync/load_seconds": policy.adapters[-1].load_seconds,
                    **(policy.fleet.metrics() if isinstance(policy, RemoteVLLMPolicy) else {}),
                    **shared_pool_metrics(),
                }  # fmt: skip
                if cfg.eval_steps and step % cfg.eval_steps == 0 and step < cfg.max_steps:
                    metrics |= self._evaluate(policy, run, step, cfg.eval_num_tasks)[0]
                findings = health.see(step, metrics)  # once per rule, as soon as it shows
                metrics["health/reported"] = float(len(health.reported))  # a curve anywhere
                run.write_metrics(step, metrics)  # every step: the run's record
                if _log_due(step, cfg, metrics):
                    trackers.log(step, metrics)
                    if cfg.log_completions:
                        run.append_rollouts(step, episodes)
                console.update(step, metrics)
                for finding in findings:
                    log.warning("health [%s] %s", finding.rule, finding.text())
                    trackers.note(step, f"health/{finding.rule}", finding.text())
                if (step == cfg.max_steps or (cfg.save_steps and step % cfg.save_steps == 0)
                        or stop):  # fmt: skip
                    run.save_checkpoint(step, model, optimizer, self._checkpoint_state(version))
                if stop:
                    raise stop
            if run is None or trackers is None:
                return figures
            final = self._headline_eval(policy, run, trackers, cfg.max_steps, "final")
            if isinstance(policy, RemoteVLLMPolicy):  # the run folder keeps every version
                policy.unload_published()
        figures["grpo/success"] = final
        plot_curves(run.path / "metrics.jsonl", run.path / "reward_curve.png", title=cfg.env)
        console.console.print(write_summary(run.path, figures))
        return figures

    # ---- stages -------------------------------------------------------------------------
    def _policy_and_start(
        self,
        stack: contextlib.ExitStack,
        run: RunDir | None,
        trackers: Trackers | None,
        figures: dict[str, float],
        namespace: str,
    ) -> tuple[RolloutPolicy, Path]:
        """The run's rollout policy (open in ``stack``) and the model it trains from.

        Before an SFT warm start, the base model's eval (``figures["base/success"]``) plays on
        the run's own engine where that engine can take the warm start's weights in place
        (`engine_beside_warm_start`, the warm start still to train). That saves an engine
        start (20-30 s of the quickstart's few minutes on two cores). Elsewhere the base model
        gets an engine of its own, closed before the warm start trains: on a GPU the SFT then
        has all of its memory.
        """
        cfg, world = self.config, self.world
        base_eval = bool(run and trackers and cfg.sft_steps and not run.resumed)
        in_place = (
            run is not None and engine_beside_warm_start(cfg, self._device(), world.world_size)
            and not (run.path / WARM_START / SFT_SUMMARY).is_file()
        )  # fmt: skip
        if not in_place:
            if base_eval:
                assert run is not None and trackers is not None
                greedy = {"max_tokens": cfg.max_completion_length, "temperature": 0.0}
                with self._in_process_engine(
                    self.model_dir, greedy, lora=False, rollout_mode="auto"
                ) as base:  # fmt: skip
                    figures["base/success"] = self._base_eval(base, run, trackers)
            start_model: Path = world.broadcast(self._warm_start(run) if run else None)
            served = self._policy(start_model, namespace)
            stack.enter_context(served)
            return served, start_model
        assert run is not None
        policy = self._policy(self.model_dir, namespace)
        assert isinstance(policy, VLLMPolicy)  # by in_place's conditions
        stack.enter_context(policy)
        if base_eval:
            assert trackers is not None
            figures["base/success"] = self._base_eval(policy, run, trackers)
        start_model = self._warm_start(run)
        seconds = policy.reload_weights(start_model)
        log.info("the engine took the warm start's weights in place in %.2f s", seconds)
        return policy, start_model

    def _warm_start(self, run: RunDir) -> Path:
        """The SFT warm start (once per run; reused on resume), or the model as it is.

        A reused one was checked whole when the run folder opened (`RunDir.check_open`).
        """
        cfg = self.config
        if not cfg.sft_steps:
            return self.model_dir
        out = run.path / WARM_START
        if (out / SFT_SUMMARY).is_file():
            return out
        traces, validation = cfg.sft_split(self.train_tasks)
        # the env and template the rollouts play: traces of other limits or renders would
        # teach tokens the run never samples
        return sft_warm_start(
            self.model_dir, cfg.env, cfg.run_env_kwargs, out,
            warm_start_config(cfg, self._device(), _log_sft_progress),
            tasks=traces, validation_tasks=validation,
            scripts=cfg.sft_scripts, chat_template_kwargs=cfg.chat_template_kwargs,
            length_knob="max_model_len", traces=self._warm_start_traces,
        )  # fmt: skip

    def _policy(self, model_dir: Path, namespace: str) -> RolloutPolicy:
        """The rollout policy: an in-process engine serving ``model_dir`` + LoRA, or servers.

        With ``rollout_servers`` episodes run on those servers, adapters named in
        ``namespace`` (`run_namespace`: a new run, or a resumed one, never meets the versions
        of another run or of its killed process there). Under torchrun each
        rank has its own and rolls out only its share of each step.
        """
        cfg = self.config
        sampling = {
            "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
            "min_p": cfg.min_p or 0.0, "max_tokens": cfg.max_completion_length, "seed": cfg.seed,
        }  # fmt: skip
        mode: ModeChoice = cfg.rollout_mode  # concat: the engine refuses a template that cannot
        if cfg.rollout_servers:
            return RemoteVLLMPolicy(
                model_dir, rollout_fleet(cfg, model_dir, namespace),
                router_url=cfg.rollout_router_url, sampling=sampling,
                max_model_len=cfg.max_model_len, chat_template_kwargs=cfg.chat_template_kwargs,
                rollout_mode=mode, on_server_failure=cfg.on_server_failure,
                adapter_storage=cfg.adapter_storage, publishes_adapters=True,
            )  # fmt: skip
        return self._in_process_engine(model_dir, sampling, lora=True, rollout_mode=mode)

    def _in_process_engine(
        self, model_dir: Path, sampling: dict[str, Any], *, lora: bool, rollout_mode: ModeChoice
    ) -> HFPolicy | VLLMPolicy:
        """The ``rollout_engine`` policy on ``model_dir`` (training rollouts and evals).

        Float32 on the CPU (exact logprobs), bfloat16 elsewhere; ``lora`` makes room in vLLM
        for the adapter versions each sync loads (`HFPolicy` loads them on demand). On a GPU
        vLLM takes ``vllm_gpu_memory_utilization`` of it, leaving the rest to the trainer.
        """
        cfg = self.config
        on_cpu = self._device() == "cpu"
        dtype = "float32" if on_cpu else "bfloat16"
        common: dict[str, Any] = {
            "sampling": sampling, "max_model_len": cfg.max_model_len, "dtype": dtype,
            "chat_template_kwargs": cfg.chat_template_kwargs, "rollout_mode": rollout_mode,
        }  # fmt: skip
        if cfg.rollout_engine == "hf":
            return HFPolicy(model_dir, device=self._device(), **common)
        engine_kwargs: dict[str, Any] = (
            {} if on_cpu else {"gpu_memory_utilization": cfg.vllm_gpu_memory_utilization}
        )
        if lora:
            common |= {"enable_lora": True, "max_lora_rank": cfg.lora_r}
            if cfg.rollout_compile:  # the run's engine; base and warm-start evals stay eager
                engine_kwargs["enforce_eager"] = False
        return VLLMPolicy(model_dir, **common, engine_kwargs=engine_kwargs)

    def _decide_mode(self, policy: RolloutPolicy) -> None:
        """Decide ``concat``/``per_turn`` on the env's reference episode, as `check` does."""
        example = reference_example(self.config, policy.tokenizer)
        policy.mode_for(self.tools, example or ())  # logs the decision and its reason

    def _device(self) -> str:
        return resolved_device(self.config)

    def _trainable(self, model_dir: Path) -> tuple[Any, Any]:
        """The policy model with a fresh LoRA adapter (seeded), and its AdamW optimiser."""
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        cfg, device = self.config, self._device()
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        if cfg.dtype != "auto":
            dtype = getattr(torch, cfg.dtype)
        torch.manual_seed(cfg.seed)  # before get_peft_model: the adapter init is seeded
        base: Any
        if cfg.load_in_4bit:  # QLoRA: 4-bit base (bitsandbytes, CUDA), LoRA in `dtype`
            from transformers import BitsAndBytesConfig

            quantized = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype)
            base = AutoModelForCausalLM.from_pretrained(
                model_dir, quantization_config=quantized, device_map={"": device}
            )
        else:
            base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
            base = base.to(device)
        lora = LoraConfig(
            r=cfg.lora_r, lora_dropout=cfg.lora_dropout,
            lora_alpha=cfg.lora_alpha,  # type: ignore[arg-type]  # PEFT scales by a float
            target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM",
        )  # fmt: skip
        model = get_peft_model(base, lora)
        model.train()  # lora_dropout applies; transformers checkpoints in train mode only
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        trainable = [p for p in model.parameters() if p.requires_grad]
        decay = cfg.weight_decay
        return model, torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=decay)

    def _tasks_for(self, step: int) -> list[int]:
        """The step's tasks: consecutive slices of seeded shuffles of the train tasks.

        A pure function of (seed, step), so a resumed run sees the same data order. Without
        `shuffle_dataset`, slices of the train tasks in their order, pass after pass.
        """
        cfg, pool = self.config, self.train_tasks
        first = (step - 1) * cfg.tasks_per_step
        tasks = []
        for position in range(first, first + cfg.tasks_per_step):
            epoch, offset = divmod(position, len(pool))
            order = list(pool)
            if cfg.shuffle_dataset:
                random.Random(cfg.seed * 7_919 + epoch).shuffle(order)
            tasks.append(order[offset])
        return tasks

    def _advantages(
        self, episodes: list[Trajectory], shares: list[list[Trajectory]]
    ) -> tuple[Advantages, list[float | None], int]:
        """Advantages over every rank's ``episodes``, this rank's share, and the masked count.

        The share has None for episodes that train nothing (dropped, or cut off under
        `mask_truncated_completions`; the count is of the latter).
        """
        cfg = self.config
        advantages = self._group_advantages(episodes)
        values = advantages.values
        if cfg.mask_truncated_completions:
            values = mask_truncated(values, episodes)
        masked = sum(a is None for a in values) - sum(a is None for a in advantages.values)
        first = sum(len(share) for share in shares[: self.world.rank])
        return advantages, values[first : first + len(shares[self.world.rank])], masked

    def _group_advantages(self, episodes: Sequence[Trajectory]) -> Advantages:
        """The step's advantages, as `multi_objective_aggregation` makes them."""
        cfg = self.config
        return trajectory_advantages(episodes, cfg.scale_rewards, cfg.late_policy,
                                     self.reward_weights)  # fmt: skip

    def _learn(
        self, model: Any, optimizer: Any, samples: list[Any], spec: LossSpec,
        policy: RolloutPolicy, step: int, version: int,
    ) -> tuple[tuple[dict, float], Collected | None]:  # fmt: skip
        """The step's update at its learning rate, timed, and the next step's episodes.

        Those roll out during the update with ``max_staleness`` 1; else there are none yet.
        """
        cfg = self.config
        for group in optimizer.param_groups:
            group["lr"] = cfg.learning_rate_at(step)
        if cfg.max_staleness and step < cfg.max_steps:
            return self._run(self._update_while_collecting(
                model, optimizer, samples, spec, policy, step + 1, version
            ))  # fmt: skip
        return _timed(self._update, model, optimizer, samples, spec), None

    async def _collect(self, policy: RolloutPolicy, step: int, version: int) -> Collected:
        """The step's episodes (this rank's share), flat groups replayed where asked.

        ``version`` is the adapter the engine serves while they roll out; `check_versions`
        holds every turn to it.
        """
        start = time.perf_counter()
        trajectories = await self._rollouts(policy, step)
        replayed: list[int] = []
        if self.config.resample_zero_variance_groups:
            trajectories, replayed = await self._replay_flat_groups(policy, step, trajectories)
        return Collected(trajectories, replayed, version, time.perf_counter() - start)

    async def _update_while_collecting(
        self, model: Any, optimizer: Any, samples: list[Any], spec: LossSpec,
        policy: RolloutPolicy, next_step: int, version: int,
    ) -> tuple[tuple[dict, float], Collected]:  # fmt: skip
        """The step's update, in a worker thread, while ``next_step``'s episodes roll out.

        The engine keeps serving ``version`` until both are done and the trained adapter is
        synced, so the next step trains one version behind (``max_staleness`` 1). The update
        thread cannot be cancelled: a rollout that fails or is cancelled waits for it, so the
        weights are never left half-updated.
        """
        update = asyncio.ensure_future(asyncio.to_thread(
            _timed, self._update_beside_rollouts, model, optimizer, samples, spec
        ))  # fmt: skip
        try:
            ahead = await self._collect(policy, next_step, version)
        finally:
            trained = await update
        return trained, ahead

    async def _rollouts(self, policy: RolloutPolicy, step: int) -> list[Trajectory]:
        """The rank's episodes: all ``num_generations`` of each task in its share of the step.

        Every rank plans the whole step and skips the other ranks' tasks, so each episode keeps
        the seed and task position (its group key) it has when one process plays the step.
        """
        cfg = self.config
        tasks = self._tasks_for(step)
        mine = self.world.shard(len(tasks))
        others = [
            (position, g)
            for position in range(len(tasks)) if position not in mine
            for g in range(cfg.num_generations)
        ]  # fmt: skip
        return await arollout(
            self._envs, policy, tasks=tasks, group_size=cfg.num_generations,
            seed=cfg.seed * 1_000_003 + step * cfg.episodes_per_step,
            max_concurrency=cfg.max_concurrency or cfg.episodes_per_step,
            deadline=cfg.episode_deadline_s, skip=others,
        )  # fmt: skip

    async def _replay_flat_groups(
        self, policy: RolloutPolicy, step: int, trajectories: list[Trajectory]
    ) -> tuple[list[Trajectory], list[int]]:
        """Groups whose rewards are all equal, played again once on other train tasks.

        Why: every episode of such a group gets advantage 0, so the group adds nothing to the
        update. The replacements are train tasks this step did not draw, in an order fixed by
        (seed, step), each rank taking its own share, so ranks never replay the same task and
        a resumed run replays the same ones; their episodes take the flat groups' places (task
        positions). Their seeds lie past every step's (`_REPLAY_SEEDS`), one block per rank.
        Returns the step's episodes and the replacement task indices.
        """
        cfg, world = self.config, self.world
        flat = self._group_advantages(trajectories).zero_variance_groups
        unused = sorted(set(self.train_tasks) - set(self._tasks_for(step)))
        random.Random(f"{cfg.seed}/{step}").shuffle(unused)
        tasks = unused[world.rank :: world.world_size][: len(flat)]
        if not tasks:
            return trajectories, []
        first_seed = _REPLAY_SEEDS + (step * world.world_size + world.rank) * cfg.episodes_per_step
        replays = await arollout(
            self._envs, policy, tasks=tasks, group_size=cfg.num_generations,
            seed=cfg.seed * 1_000_003 + first_seed,
            max_concurrency=cfg.max_concurrency or cfg.episodes_per_step,
            deadline=cfg.episode_deadline_s,
        )  # fmt: skip
        return swap_groups(trajectories, dict(zip(flat, range(len(tasks)))), replays), tasks

    def _update_beside_rollouts(
        self, model: Any, optimizer: Any, samples: list[Any], spec: LossSpec
    ) -> dict:
        """`_update` with one core left to an in-process engine rolling out on the same CPU.

        Why: the update's torch threads and the engine's worker share the cores and slow each
        other. On 2 cores (`bench/trainer_bench.py`, a helper's interleaved runs with the
        update patched from outside) rollouts took 0.41-0.52 s a step beside an all-threads
        update against 0.36-0.37 s beside this one, and the overlapped step 0.48-0.54 s
        against 0.37-0.38 s. Fewer threads sum in another order: the weights differ from an
        all-threads run at rounding level (5.7e-9 after one step); a resumed run matches its
        own kind. Servers (``rollout_servers``) and GPUs leave the CPU to the update. The
        count is set on this worker thread (OpenMP keeps one per thread) and restored to the
        training thread's full count (`_train`), not this thread's, which may be the reduced
        one of an earlier step.
        """
        if self._device() != "cpu" or self.config.rollout_servers:
            return self._update(model, optimizer, samples, spec)
        import torch

        torch.set_num_threads(max(1, self._torch_threads - 1))
        try:
            return self._update(model, optimizer, samples, spec)
        finally:
            torch.set_num_threads(self._torch_threads)

    def _update(self, model: Any, optimizer: Any, samples: list[Any], spec: LossSpec) -> dict:
        """``num_iterations`` optimiser steps on the step's samples; returns loss metrics.

        Under torchrun ``samples`` are this rank's: the loss is divided by the counts of the
        whole step (every rank's) and the gradients are summed over the ranks, so each rank
        makes the update one process makes on the union (tests/trainers/test_distributed.py).
        """
        import torch

        cfg = self.config
        tokens = sum(s.num_trained_tokens for s in samples)
        episodes = sum(s.share for s in samples)  # a per-turn sample is part of its episode
        counts = self.world.gather((episodes, tokens))
        num_sequences, num_items = (float(sum(column)) for column in zip(*counts))
        if not num_sequences:  # every group had zero variance or was dropped: nothing to learn
            return {"train/samples": 0.0}
        micro = self._micro_batches(model, samples)
        olds: list[torch.Tensor | None] = [None] * len(micro)
        trainable = [p for p in model.parameters() if p.requires_grad]
        iterations: list[tuple[dict[str, float], float]] = []
        for iteration in range(cfg.num_iterations):
            optimizer.zero_grad(set_to_none=True)
            if self._entropy is not None:  # the coefficient of the last step's entropy
                spec = dataclasses.replace(spec, entropy_coef=self._entropy.applied)
            passes: list[tuple[dict[str, float], float]] = []
            entropy_sum = entropy_tokens = 0.0
            for k, part in enumerate(micro):
                out, logps = self._micro_loss(
                    model, part, spec, olds[k], num_sequences=num_sequences, num_items=num_items
                )
                out.loss.backward()
                passes.append((out.metrics, float(part.num_items)))
                entropy_sum += out.trained_entropy[0]
                entropy_tokens += out.trained_entropy[1]
                if iteration == 0:
                    olds[k] = logps.detach()  # the sampling-time policy, for later iterations
            metrics = combine_metrics(passes)
            self.world.sum_gradients(trainable)
            if cfg.max_grad_norm is not None:
                norm = float(torch.nn.utils.clip_grad_norm_(trainable, cfg.max_grad_norm))
            else:
                norm = float(torch.nn.utils.get_total_norm([p.grad for p in trainable
                                                            if p.grad is not None]))  # fmt: skip
            metrics["train/grad_norm"] = norm  # unclipped too: where a blow-up shows first
            # a NaN or inf gradient (a bf16 overflow, a NaN reward) would write NaN into the
            # adapter and every later step: that update is skipped, counted and reported
            metrics["train/skipped_updates"] = 0.0 if math.isfinite(norm) else 1.0
            if math.isfinite(norm):
                optimizer.step()
            else:
                log.warning("step update %d of %d skipped: the gradient is not finite (%s)",
                            iteration + 1, cfg.num_iterations, norm)  # fmt: skip
            if self._entropy is not None:
                totals = self.world.gather((entropy_sum, entropy_tokens))
                self._entropy.observe(*(sum(column) for column in zip(*totals)))
            if spec.entropy_coef or self._entropy is not None:
                metrics["loss/entropy_coef"] = spec.entropy_coef
            iterations.append((metrics, 1.0))
        summary = combine_metrics(iterations, summed=())
        summary["train/samples"] = float(len(samples))
        summary["train/tokens"] = float(tokens)
        summary["train/micro_batches"] = float(len(micro))
        summary["train/pad_fraction"] = _mean([part.pad_fraction for part in micro])
        return summary

    def _micro_batches(self, model: Any, samples: list[Any]) -> list[Batch]:
        """``samples`` padded onto the device, in micro-batches (`micro_batches`).

        No parts for a rank without samples while its peers have some: it still takes part
        in the gradient sum, with zeros.
        """
        cfg, device = self.config, self._device()
        pad = int(getattr(model.config, "pad_token_id", None) or 0)
        shared = 0 if cfg.gradient_checkpointing else shared_prefix_length(samples)
        groups = micro_batches(
            samples, cfg.gradient_accumulation_steps, cfg.micro_batch_tokens,
            shared_prefix=shared if shared >= MIN_SHARED_PREFIX else 0,
            pass_cost=PASS_COST_TOKENS.get(device.split(":")[0], PASS_COST_TOKENS["cuda"]),
        )  # fmt: skip
        return [collate(group, pad_token_id=pad).to(device) for group in groups]

    def _micro_loss(
        self,
        model: Any,
        part: Batch,
        spec: LossSpec,
        old: Any,
        *,
        num_sequences: float,
        num_items: float,
    ) -> tuple[Any, Any]:
        """One micro-batch's part of the step's loss.

        ``num_sequences`` (episodes) and ``num_items`` (trained tokens) count the whole
        step's samples, every rank's: the loss's normalisers.
        """
        import torch

        temperature, share = self.config.temperature, not self.config.gradient_checkpointing
        ids, mask, keep = part.input_ids, part.attention_mask, logits_to_keep(part.loss_mask)
        logits = policy_logits(model, ids, mask, share, keep)
        logps = token_logprobs(logits, ids, temperature)
        ref = None
        if spec.beta:
            with torch.no_grad(), model.disable_adapter():  # the base model, no second copy
                ref = token_logprobs(policy_logits(model, ids, mask, share, keep), ids, temperature)
        if spec.entropy_coef:  # the bonus trains on it
            entropies = token_entropy(logits, temperature, width=ids.shape[1])
        else:
            with torch.no_grad():
                entropies = token_entropy(logits.detach(), temperature, width=ids.shape[1])
        out = grpo_loss(
            logps, part.advantages, part.loss_mask, spec,
            old_logps=old, engine_logps=part.engine_logprobs, ref_logps=ref,
            entropies=entropies, num_sequences=num_sequences, num_items=num_items,
            shares=part.shares,
        )  # fmt: skip
        return out, logps

    def _checkpoint_state(self, adapter_version: int) -> dict[str, Any]:
        """What a checkpoint holds beside the weights, optimiser and RNG states."""
        state: dict[str, Any] = {"adapter_version": adapter_version}
        if self._entropy is not None:
            state["entropy_control"] = self._entropy.state()
        return state

    def _sync(self, policy: RolloutPolicy, model: Any, run: RunDir | None, expected: int) -> int:
        """Save the adapter as version ``expected`` and make the engine serve it, or stop.

        Refuses to go on when the engine does not report the new version: rollouts that
        silently keep sampling an old adapter are the worst bug users report in peers. Rank 0
        saves the adapter (every rank holds the same weights) and loads it first: on shared
        rollout servers that publishes it, so when the other ranks load the folder whose path
        it broadcasts, their own engines load it, and shared servers already serve it.
        """
        path = run.save_adapter(model, expected) if run else None
        if path is not None:
            version = policy.load_adapter(path, version=expected)
        path = self.world.broadcast(path)
        if run is None:
            version = policy.load_adapter(path, version=expected)
        served = self._run(policy.served_adapters())
        if version != expected or policy.adapter_version != expected or expected not in served:
            raise StaleAdapterError(
                f"the engine did not take adapter v{expected} (it reports v{version}, "
                f"loaded {sorted(served)}); refusing to train on stale rollouts"
            )
        return version

    def _evaluate(
        self,
        policy: Any,
        run: RunDir,
        step: int,
        num_tasks: int | None,
        label: str = "eval",
    ) -> tuple[dict[str, float], list[Trajectory]]:
        """Greedy episodes on the held-out tasks (kept in the run folder); their figures, and them.

        ``label`` names the metrics: ``eval`` (during training; step 0 is the starting
        model), ``base`` (the model before the SFT warm start), ``final`` (all eval tasks).
        A mid-run eval's figures go into its step's line (every one of them, not the success
        alone: ``eval/reward`` had a point at step 0 only).
        """
        cfg = self.config
        tasks = self.eval_tasks[:num_tasks] if num_tasks else self.eval_tasks
        trajectories = self._run(
            arollout(
                self._envs, policy.with_sampling(temperature=0.0), tasks=tasks, group_size=1,
                seed=cfg.seed, max_concurrency=max(len(tasks), 1),
                deadline=_eval_deadline(cfg, len(tasks)),
            )
        )  # fmt: skip
        run.append_eval(step, trajectories, label)
        figures = eval_metrics(trajectories)
        return {k.replace("eval/", f"{label}/"): v for k, v in figures.items()}, trajectories

    def _headline_eval(
        self, policy: Any, run: RunDir, trackers: Trackers, step: int, label: str
    ) -> float:
        """An eval on every held-out task with a metrics line of its own; its success.

        Step 0's, the base model's and the final one: their figures go to the trackers too
        (only ``metrics.jsonl`` had them, so ``final/success``, the run's headline, was
        missing from TensorBoard, trackio and W&B).
        """
        figures, episodes = self._evaluate(policy, run, step, num_tasks=None, label=label)
        run.write_metrics(step, figures)
        trackers.log(step, figures)
        if f"{label}/success" not in figures:  # a figure of nothing measured is no figure
            which = "held-out" if label == "eval" else label
            raise InfraError(
                f"the {which} eval's {len(episodes)} episodes all ended infra_error (one said: "
                f"{_one_infra_error(episodes)}); the run stopped at step {step}: fix the "
                "infrastructure, then run again with --resume"
            )
        return figures[f"{label}/success"]

    def _base_eval(self, policy: RolloutPolicy, run: RunDir, trackers: Trackers) -> float:
        """The base model's eval (before the SFT warm start, no adapter loaded); its success."""
        self._decide_mode(policy)  # the run's reference episode decides, as for the run
        return self._headline_eval(policy, run, trackers, 0, "base")


def _eval_deadline(cfg: GRPOConfig, episodes: int) -> float | None:
    """An eval's deadline: ``episode_deadline_s`` for each step's worth of its episodes.

    Why: evals had none, so a reward function or tool that never returned hung the run in
    its step-0 eval while its steps stopped at the deadline. An eval plays its episodes at
    once, more than a step's, so it gets a step's deadline per step's worth of them; a late
    one counts as not solved (`eval_metrics`).
    """
    if cfg.episode_deadline_s is None:
        return None
    return cfg.episode_deadline_s * math.ceil(episodes / (cfg.tasks_per_step * cfg.num_generations))


def swap_groups(
    episodes: list[Trajectory], replaced: dict[Any, int], replays: list[Trajectory]
) -> list[Trajectory]:
    """``episodes`` with some groups swapped for replayed ones.

    ``replaced`` maps a group key to a task position in the replay's own plan; the replayed
    group takes the old group's place and task position (its group key in this step).
    """
    by_position: dict[int | None, list[Trajectory]] = {}
    for replay in replays:
        by_position.setdefault(replay.task_position, []).append(replay)
    out: list[Trajectory] = []
    for key, group in itertools.groupby(episodes, key=group_key):
        if key not in replaced:
            out.extend(group)
            continue
        old = list(group)
        for replay in by_position[replaced[key]]:
            replay.task_position = old[0].task_position
            out.append(replay)
    return out


def _mostly_infra_errors(episodes: Sequence[Trajectory]) -> bool:
    """Whether at least half of a step's episodes ended ``infra_error``."""
    return 0 < len(episodes) <= 2 * sum(t.status == "infra_error" for t in episodes)


def _infra_stop(
    episodes: Sequence[Trajectory], broken_steps: int, step: int, patience: int | None
) -> InfraError | None:
    """The error that stops the run once `infra_error_patience` steps in a row were broken."""
    if patience is None or broken_steps < patience:
        return None
    return InfraError(
        f"{broken_steps} steps in a row had at least half their episodes end infra_error "
        f"(one said: {_one_infra_error(episodes)}); the run stopped at step {step} after a "
        "checkpoint: fix the "
        "infrastructure, then run again with --resume (infra_error_patience sets the steps)"
    )


def _one_infra_error(episodes: Sequence[Trajectory]) -> str:
    """The last line of the first ``infra_error`` episode's error: what a stop quotes."""
    errors = [t.error for t in episodes if t.status == "infra_error" and t.error]
    return (errors[0].strip().splitlines() or [""])[-1][:200] if errors else "no message"


def _all_failed(episodes: Sequence[Trajectory]) -> bool:
    """Whether every episode of a step ended ``error`` or ``infra_error``, all with one reward.

    Then every advantage is zero and the update is a no-op: an env or reward function that
    raises every time would otherwise run out all its steps and exit 0. Episodes that differ
    in reward (another reward function still scored them) still teach, so they do not count.
    """
    failed = bool(episodes) and all(t.status in ("error", "infra_error") for t in episodes)
    rewards = {t.total_reward if math.isfinite(t.total_reward) else None for t in episodes}
    return failed and len(rewards) == 1  # a NaN reward (status error) teaches nothing either


def _all_late(episodes: Sequence[Trajectory]) -> bool:
    """Whether every episode of a step missed its deadline: none was scored.

    A run with an ``episode_deadline_s`` too short for its episodes trained on nothing at
    every step, logged as such, and went on to its last step.
    """
    return bool(episodes) and all(t.status == "late" for t in episodes)


def _broken_step(episodes: Sequence[Trajectory]) -> bool:
    """Whether a step counts towards `infra_error_patience`: nothing in it can train."""
    return _mostly_infra_errors(episodes) or _all_failed(episodes) or _all_late(episodes)


class EpisodesFailedError(Error):
    """Every episode of several steps in a row raised (the env, a tool loop or a reward)."""


class EpisodesLateError(Error):
    """Every episode of several steps in a row missed the step's deadline."""


def _broken_stop(
    episodes: Sequence[Trajectory], broken_steps: int, step: int, patience: int | None
) -> Error | None:
    """The error that stops the run after `infra_error_patience` broken steps in a row.

    `InfraError` when the infrastructure failed; `EpisodesFailedError` when the env's own code
    did, so the message points at the env or reward function rather than at a service.
    """
    if _mostly_infra_errors(episodes) or patience is None or broken_steps < patience:
        return _infra_stop(episodes, broken_steps, step, patience)
    if _all_late(episodes):
        return EpisodesLateError(
            f"{broken_steps} steps in a row had every episode miss episode_deadline_s; nothing "
            f"was scored, so nothing was learnt: the run stopped at step {step} after a "
            "checkpoint: raise episode_deadline_s (null waits for every episode), then run "
            "again with --resume (infra_error_patience sets the steps)"
        )
    errors = [t.error for t in episodes if t.error]
    last = (errors[0].strip().splitlines() or [""])[-1][:200] if errors else "no message"
    return EpisodesFailedError(
        f"{broken_steps} steps in a row had every episode end in an error (one said: {last}); "
        f"nothing was scored, so nothing was learnt: the run stopped at step {step} after a "
        "checkpoint: fix the env or its reward functions (agentgym check), then run again with "
        "--resume (infra_error_patience sets the steps)"
    )


def _interrupted(run: RunDir) -> str:
    """What a stopped run kept, and how to go on: the console said nothing after Ctrl-C."""
    checkpoint = run.latest_checkpoint()
    kept = (
        f"its newest checkpoint is {checkpoint.name} (later steps are replayed)"
        if checkpoint is not None else "it has no checkpoint yet (a resume starts at step 1)"
    )  # fmt: skip
    return (
        f"interrupted: {run.path} is kept and {kept}; continue it with the same command "
        "and --resume"
    )


def _log_due(step: int, cfg: GRPOConfig, metrics: dict[str, Any]) -> bool:
    """Trackers get every ``logging_steps``-th step, the last one, and every eval."""
    evaluated = any(name.startswith("eval/") for name in metrics)
    return step % cfg.logging_steps == 0 or step == cfg.max_steps or evaluated


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    """``fn(*args)`` and the seconds it took."""
    start = time.perf_counter()
    return fn(*args), time.perf_counter() - start


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _log_sft_progress(record: dict[str, Any]) -> None:
    """Every 50th SFT step and every validation on the log (SFT takes minutes on a CPU)."""
    if "reference_accuracy" in record:
        log.info(
            "sft step %d: loss %.4f, validation traces reproduced %.0f%%",
            record["step"], record["loss"], 100 * record["reference_accuracy"],
        )  # fmt: skip
    elif record.get("step", 0) % 50 == 0:
        log.info("sft step %d: loss %.4f", record["step"], record.get("loss", float("nan")))


def _without_token_ids(trajectory: Trajectory) -> Trajectory:
    """A copy without prompt ids and logprobs, to send to the other ranks.

    Advantages and episode metrics do not read them, and they are most of an episode's bytes.
    """
    turns = [
        dataclasses.replace(turn, prompt_ids=None, logprobs=None, completion_mask=None)
        for turn in trajectory.turns
    ]
    return dataclasses.replace(trajectory, turns=turns)


def check_versions(trajectories: Sequence[Trajectory], version: int) -> None:
    """Every turn must come from ``version``, the adapter served while the step rolled out.

    A turn of any other version would train on a policy the step never accounted for
    (``rollout/staleness`` is then wrong, and the importance weights with it).
    """
    stale = {
        t.adapter_version
        for trajectory in trajectories
        for t in trajectory.turns
        if t.adapter_version != version
    }
    if stale:
        raise StaleAdapterError(
            f"turns were sampled with adapter version(s) {sorted(map(str, stale))} where "
            f"the step rolled out on v{version}; refusing to train on them"
        )
