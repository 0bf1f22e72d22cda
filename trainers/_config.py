"""`GRPOConfig`: every knob of a GRPO + LoRA run, checked before anything loads.

Names follow TRL's `trl.GRPOConfig` where they mean the same thing (``learning_rate``,
``num_generations``, ``beta``, ``epsilon``, ``loss_type``, ``scale_rewards`` ...), so a TRL user
can carry a config over; the rest are ours (env, tasks, multi-turn, LoRA sync, stragglers).

Each field's help text lives once, in its ``metadata["help"]``; the class docstring is built
from it, so ``help(GRPOConfig)`` and the saved docs cannot drift apart.

Example::

    config = GRPOConfig.from_yaml("configs/quickstart.yaml")
    config = GRPOConfig(model="tiny", env="calculator", loss_type="grpo", lora_r=8)
    yaml.safe_dump(config.to_dict())   # the resolved config, saved next to each checkpoint
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentgym._errors import ConfigError
from agentgym._tasks import parse_tasks

from ._config_rules import (
    CONFIG_RULES,
    SEED_LIMIT,
    SFT_VALIDATION_TASKS,
    VLLM_LORA_RANKS,
    check_split,
    matches,
    split_off_validation,
)
from ._trl_keys import trl_key_hint

LossType = Literal["grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
ImportanceSamplingLevel = Literal["token", "sequence"]
ImportanceSamplingMode = Literal[
    "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
]
ScaleRewards = Literal["group", "batch", "none"]
MultiObjectiveAggregation = Literal["sum_then_normalize", "normalize_then_sum"]
RolloutMode = Literal["auto", "concat", "per_turn"]
LatePolicy = Literal["drop", "drop_group", "zero"]
LrSchedule = Literal["constant", "constant_with_warmup", "linear", "cosine"]
ServerFailure = Literal["retry", "fail"]
RolloutEngine = Literal["vllm", "hf"]
SFTMethod = Literal["full", "lora"]
Device = Literal["auto", "cpu", "cuda"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]

#: Held-out tasks when `eval_tasks` is not set: a tenth of the env's, at most this many.
DEFAULT_EVAL_TASKS = 100
#: Deprecated TRL names accepted by `from_dict`, mapped to the current TRL name.
_RENAMED = {"vllm_importance_sampling_cap": "vllm_importance_sampling_clip_max"}


def _knob(default: Any, help: str) -> Any:
    """A dataclass field with its help text; mutable defaults are copied per instance."""
    if isinstance(default, (list, dict)):
        return field(default_factory=functools.partial(type(default), default),
                     metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _unknown_knobs(keys: list[Any], knobs: list[str]) -> ConfigError:
    """The error for keys that are not knobs, all in one line (a TRL file has several).

    For each: what to set instead of a TRL key, else the closest knob.
    """

    def fix(key: Any) -> str:
        close = difflib.get_close_matches(str(key), knobs, n=1)
        hint = trl_key_hint(str(key)) or (
            f"did you mean {close[0]!r}?" if close else "see `help(GRPOConfig)`"
        )
        return f"{key!r}; {hint}"

    if len(keys) == 1:
        return ConfigError(f"unknown config key {fix(keys[0])}")
    return ConfigError(f"{len(keys)} unknown config keys: {' | '.join(map(fix, keys))}")


@dataclass
class GRPOConfig:
    """Configuration of `GRPOTrainer` (and of the optional SFT warm start before it).

    Units: lengths are tokens, times are seconds, steps are optimiser steps. One step plays
    ``tasks_per_step`` tasks ``num_generations`` times each, scores them, and makes one
    optimiser update per ``num_iterations``.
    """

    # --- model and env --------------------------------------------------------------------
    model: str = _knob(
        "tiny",
        "Policy model: a local folder or a Hugging Face id (needs a chat template that renders "
        "tools), or 'tiny' / 'tiny:PRESET' (e.g. 'tiny:quickstart') for the project's offline "
        "tiny model (`agentgym.engine.tiny`), its weights seeded by `seed`.",
    )
    env: str = _knob("calculator", "Env id or short name, as accepted by `agentgym.make`.")
    env_kwargs: dict[str, Any] = _knob({}, "Keyword arguments for `agentgym.make(env, ...)`.")
    train_tasks: str | list[int] | None = _knob(
        None,
        "Task indices trained on: 'start:stop' (half-open) or a list. None: every task of the "
        "env not in `eval_tasks`. The data order is a shuffle of these by `seed`, reshuffled "
        "each pass (see `shuffle_dataset`); must not overlap `eval_tasks`.",
    )
    shuffle_dataset: bool = _knob(
        True,
        "Play the train tasks in a seeded shuffle, reshuffled each pass (TRL's name). False: "
        "in the order `train_tasks` lists them, every pass (a curriculum).",
    )
    eval_tasks: str | list[int] | None = _knob(
        None,
        "Held-out task indices for evaluation: 'start:stop' (half-open) or a list. None: the "
        f"env's first tasks not in `train_tasks`, a tenth of them, at most {DEFAULT_EVAL_TASKS}.",
    )
    eval_num_tasks: int | None = _knob(
        None,
        "Tasks played at each periodic eval: the first N of `eval_tasks` (the same ones every "
        "time, so curves compare). None: all of them. The final eval always plays all.",
    )
    max_turns: int | None = _knob(
        None,
        "Assistant turns per episode before it is truncated. None: the env's own `max_turns`.",
    )
    chat_template_kwargs: dict[str, Any] = _knob(
        {},
        "Extra keyword arguments for the tokenizer's chat template (e.g. "
        "{'enable_thinking': False} for Qwen3), used in rollouts and SFT alike.",
    )

    # --- generation (per turn) ------------------------------------------------------------
    num_generations: int = _knob(
        8, "Episodes per task in a group (G); advantages compare them. At least 2."
    )
    tasks_per_step: int = _knob(
        4, "Distinct tasks per step; a step plays tasks_per_step * num_generations episodes."
    )
    max_completion_length: int = _knob(
        256, "Most tokens the policy may generate in one turn (vLLM's max_tokens)."
    )
    max_episode_tokens: int | None = _knob(
        None,
        "Most tokens the policy may sample in one episode, all turns together (the env's "
        "`max_episode_tokens`); past it the episode ends as truncated. None: no budget but "
        "`max_model_len`.",
    )
    max_model_len: int = _knob(
        4096,
        "Context window of the rollout engine (prompt + history + completion); an episode "
        "whose next prompt no longer fits ends as truncated and is scored.",
    )
    temperature: float = _knob(
        1.0,
        "Sampling temperature (> 0). The trainer divides logits by the same value, so engine "
        "and trainer logprobs describe the same distribution.",
    )
    top_p: float = _knob(
        1.0, "Nucleus sampling mass in (0, 1]; 1.0 keeps all tokens. Below 1 biases IS weights."
    )
    top_k: int = _knob(
        0, "Keep only the k most likely tokens; 0 disables. Above 0 biases IS weights."
    )
    min_p: float | None = _knob(
        None,
        "Drop tokens below min_p times the top token's probability, in [0, 1]. None: off.",
    )
    max_concurrency: int | None = _knob(
        None, "Episodes in flight at once. None: all episodes of the step."
    )
    rollout_mode: RolloutMode = _knob(
        "auto",
        "How an episode becomes training samples. 'concat': one sequence per episode (needs "
        "every turn's prompt to extend the previous one as tokens); 'per_turn': one sample per "
        "turn, each with the episode's advantage; 'auto': concat where the prefix holds, else "
        "per_turn, decided per episode.",
    )
    episode_deadline_s: float | None = _knob(
        300.0,
        "Seconds a step waits for its episodes after rollouts start; late ones are handled by "
        "`late_policy` and logged. An eval waits this long per step's worth of its episodes "
        "(a late one counts as not solved). None: wait for every episode.",
    )
    late_policy: LatePolicy = _knob(
        "drop",
        "What a late episode costs. 'drop': only that episode leaves the step (its group is "
        "scored on the rest, like an infra_error); 'drop_group': its whole group leaves; "
        "'zero': it stays in its group with reward 0 and its finished turns train, so a "
        "policy cannot escape a bad score by running out the clock (slow tools, long turns). "
        "A late episode that never started (no slot before the deadline) leaves under each.",
    )
    max_staleness: int = _knob(
        0,
        "Adapter versions a trained episode may lag behind the weights it trains (0 or 1). "
        "0: on-policy, each step rolls out on the adapter just synced. 1: the next step's "
        "episodes roll out on the current adapter while this step trains (rollout and update "
        "overlap, one version behind; the importance-sampling correction against the "
        "engine's logprobs accounts for the lag). A resumed run's first step rolls out fresh.",
    )
    infra_error_patience: int | None = _knob(
        3,
        "Consecutive steps in which at least half the episodes ended infra_error (a sandbox, "
        "tool service or engine failed, not the model), or every episode ended error or "
        "infra_error (the env or a reward function raised each time), or every episode was "
        "late (episode_deadline_s too short), before the run stops with InfraError "
        "(EpisodesFailedError, EpisodesLateError for the others), after a checkpoint: fix "
        "what broke and `--resume`. Each such step trains on what is left; a run whose "
        "infrastructure or env is broken would otherwise spend every remaining step on "
        "nothing. None: never stop.",
    )

    # --- rollout engine: in process, or servers (scale-out) -------------------------------
    rollout_engine: RolloutEngine = _knob(
        "vllm",
        "The in-process rollout engine. 'vllm' (`VLLMPolicy`): continuous batching, LoRA "
        "versions hot-loaded. 'hf' (`HFPolicy`): transformers `generate` on `device`, the turns "
        "queued together sampled as one batch (which waits for its longest turn), adapter "
        "versions loaded from the same folders; for machines without vLLM. Both record each "
        "turn's ids, logprobs and adapter version.",
    )
    rollout_compile: bool = _knob(
        False,
        "Compile the in-process 'vllm' engine's model on the CPU build too (torch.compile, "
        "through agentgym's traced LoRA path: vLLM-CPU alone runs LoRA eager). It has not "
        "paid reliably on a 2-core machine: 8 episodes a step rolled out in 0.61x, 0.94x and "
        "1.03x the eager time (bench/trainer_bench.py --compare-compiled), the quickstart's 64 "
        "in about 1.1x, and the first start of a model shape compiles for about half a minute "
        "(later ones read vLLM's cache). GPUs compile either way (vLLM's default). False: "
        "eager on the CPU build.",
    )
    vllm_gpu_memory_utilization: float = _knob(
        0.3,
        "Share of the GPU's memory the in-process 'vllm' engine takes for its weights and KV "
        "cache (TRL's name and default for its colocated engine): the trainer's model, "
        "activations and optimiser share the same GPU, and vLLM's own default (0.9) leaves "
        "them a tenth. In (0, 1]. Not used on the CPU build (its KV cache is 1 GiB, or "
        "VLLM_CPU_KVCACHE_SPACE GiB where that is set), by 'hf' or by rollout_servers.",
    )
    rollout_servers: list[str] = _knob(
        [],
        "URLs of vLLM servers to roll out on instead of the in-process engine (each started "
        "with `--enable-lora --logprobs-mode processed_logprobs`, "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, on `model`). Episodes are routed sticky and "
        "least-loaded; each step's adapter is published to all of them. Empty: in-process.",
    )
    rollout_router_url: str | None = _knob(
        None,
        "An existing router before `rollout_servers` (vllm-router with --policy "
        "sticky_least_loaded): requests go there with the episode id as X-Session-ID. None: "
        "route on the client.",
    )
    rollout_model_name: str | None = _knob(
        None, "The servers' --served-model-name. None: the model folder's name."
    )
    adapter_storage: str | None = _knob(
        None,
        "A folder every rollout server reads (shared storage): each adapter version is copied "
        "there atomically before the servers load it. None: the run folder (one machine).",
    )
    on_server_failure: ServerFailure = _knob(
        "retry",
        "A rollout server failing mid-turn: 'retry' sends the turn to another server (exact: "
        "the prompt ids are the whole state); 'fail' ends the episode as infra_error (dropped "
        "from its group). Either way the server is routed around until it serves the adapter.",
    )

    # --- algorithm ------------------------------------------------------------------------
    learning_rate: float = _knob(
        1e-5,
        "AdamW learning rate for the LoRA weights. LoRA wants about 10x the full fine-tuning "
        "rate (TRL's 1e-6 default is for full weights).",
    )
    lr_scheduler_type: LrSchedule = _knob(
        "constant",
        "How the learning rate moves over the run, per GRPO step, as transformers' schedule of "
        "the same name: 'constant'; 'constant_with_warmup'; 'linear' and 'cosine' decay to 0 "
        "at max_steps after the warm-up. TRL defaults to 'linear'; 'constant' keeps a short "
        "run's last steps learning. A pure function of the step and max_steps, so a resumed "
        "run continues it exactly; under 'linear', 'cosine' or a fractional warmup_steps a "
        "resume keeps max_steps (a new one would change every later step's rate).",
    )
    warmup_steps: int | float = _knob(
        0,
        "Steps of linear warm-up from 0 to learning_rate: a whole number of steps, or a share "
        "of max_steps in (0, 1) (TRL's meaning). Needs a schedule with a warm-up (not "
        "'constant').",
    )
    weight_decay: float = _knob(0.0, "AdamW weight decay on the LoRA weights, >= 0.")
    beta: float = _knob(
        0.0,
        "KL coefficient (k3 estimator) against the base model, evaluated with the adapter "
        "disabled (no second model in memory). 0.0 skips the reference forward pass.",
    )
    epsilon: float = _knob(0.2, "Lower clip bound: ratios below 1 - epsilon are clipped; (0, 1).")
    epsilon_high: float | None = _knob(
        None,
        "Upper clip bound: ratios above 1 + epsilon_high are clipped. None: equal to epsilon. "
        "DAPO recommends 0.28. Must be >= epsilon. 'cispo' caps its weight at it (>= 1); "
        "'sapo' and 'vespo' have no clip: leave it None.",
    )
    loss_type: LossType = _knob(
        "dapo",
        "The policy loss, as in TRL. 'grpo': clipped ratios, mean over each sequence's tokens, "
        "then over sequences (length-biased); 'dr_grpo': token sum over a constant (samples x "
        "max_completion_length x turns); 'dapo': token sum over the step's trained tokens; "
        "'cispo' (MiniMax-M1): the ratio capped at epsilon_high weighs the log-prob, summed as "
        "dapo; 'sapo' (Soft Adaptive Policy Optimization): a sigmoid gate instead of the hard "
        "clip (sapo_temperature_pos/neg), averaged as grpo; 'luspo' (Length-Unbiased Sequence "
        "Policy Optimization): each sequence's token sum, averaged over episodes (pair it "
        "with importance_sampling_level 'sequence'); 'vespo' (Variational Sequence-Level Soft "
        "Policy Optimization): a smooth gamma weight of the sequence ratio instead of the "
        "clip (vespo_k_pos/neg, vespo_lambda_pos/neg), summed as dapo.",
    )
    sapo_temperature_pos: float = _knob(
        1.0, "'sapo' gate temperature for tokens with positive advantages (> 0; TRL's name)."
    )
    sapo_temperature_neg: float = _knob(
        1.05, "'sapo' gate temperature for the other tokens (> 0; TRL's name)."
    )
    vespo_k_pos: float = _knob(
        2.0, "'vespo' exponent k for non-negative advantages (>= 0; TRL's name)."
    )
    vespo_lambda_pos: float = _knob(
        3.0, "'vespo' decay lambda for non-negative advantages (> 0; TRL's name)."
    )
    vespo_k_neg: float = _knob(3.0, "'vespo' exponent k for negative advantages (>= 0).")
    vespo_lambda_neg: float = _knob(2.0, "'vespo' decay lambda for negative advantages (> 0).")
    importance_sampling_level: ImportanceSamplingLevel = _knob(
        "token",
        "'token': one policy ratio per token; 'sequence': the mean log-ratio over a sequence's "
        "trained tokens, one ratio per sequence (GSPO; pair it with loss_type 'grpo').",
    )
    scale_rewards: ScaleRewards = _knob(
        "group",
        "Advantage scaling: 'group' divides by each group's reward std, 'batch' by the step's "
        "std, 'none' only subtracts the group mean (Dr. GRPO).",
    )
    multi_objective_aggregation: MultiObjectiveAggregation = _knob(
        "sum_then_normalize",
        "How the env rubric's reward functions make an advantage (TRL's name): "
        "'sum_then_normalize' normalises each episode's weighted sum in its group "
        "(scale_rewards); 'normalize_then_sum' (GDPO) normalises each function's score in its "
        "group, sums them with the rubric's weights, then normalises the sums over the step, "
        "so a reward on a wide scale does not drown one on a narrow scale (scale_rewards does "
        "not apply: leave it at 'group'). Needs an env with a Rubric.",
    )
    num_iterations: int = _knob(
        1, "Optimiser updates per batch of rollouts (mu in the GRPO paper); >1 reuses samples."
    )
    gradient_accumulation_steps: int = _knob(
        1,
        "Groups of near-equal row counts a step's samples are split into, to bound memory; "
        "each is cut further where separate passes do less work than padding (a long "
        "multi-turn episode goes alone). One update per step either way.",
    )
    micro_batch_tokens: int | None = _knob(
        None,
        "Most tokens (rows x padded length) in one forward/backward pass: samples, sorted by "
        "length, are cut into micro-batches under it, so memory stays bounded however long "
        "the episodes get (see `train/pad_fraction`). None: no cap beyond "
        "`gradient_accumulation_steps`. The update is the same either way.",
    )
    gradient_checkpointing: bool = _knob(
        False,
        "Recompute each decoder layer's activations in the backward pass instead of keeping "
        "them: less memory for a second forward pass per layer (TRL's GRPOConfig turns it "
        "on by default). The rows' shared prompt prefix is then computed per row: the "
        "shared-prefix pass needs the KV cache that checkpointing turns off.",
    )
    max_grad_norm: float | None = _knob(
        1.0, "Gradient-norm clip per update. None: no clipping."
    )
    vllm_importance_sampling_correction: bool = _knob(
        True,
        "Weight each trained token by the ratio exp(trainer logp - engine logp), bounded as "
        "`vllm_importance_sampling_mode` says, to correct for engine/trainer mismatch. Only "
        "where the engine returned logprobs; tokens without one get ratio 1.",
    )
    vllm_importance_sampling_mode: ImportanceSamplingMode = _knob(
        "token_truncate",
        "As TRL: 'token_*' one ratio per token, 'sequence_*' one per sample (its tokens' "
        "log-ratios summed); '*_truncate' clips ratios to [clip_min, clip_max], '*_mask' zeroes "
        "ratios outside it (MIS). TRL 1.16 defaults to 'sequence_mask'; the quickstart's "
        "figures were measured with 'token_truncate'.",
    )
    vllm_importance_sampling_clip_max: float | None = _knob(
        3.0,
        "Upper bound of the importance-sampling ratio (>= 1: an on-policy ratio of 1 is "
        "inside). None: none, in a 'token_*' mode only ('token_mask' then masks below "
        "clip_min only; a 'sequence_*' ratio multiplies its tokens' and would overflow). "
        "TRL 1.16's name; its deprecated alias `vllm_importance_sampling_cap` is accepted by "
        "`from_dict`.",
    )
    vllm_importance_sampling_clip_min: float | None = _knob(
        None, "Lower bound of the importance-sampling ratio (in [0, 1]). None: none."
    )
    delta: float | None = _knob(
        None,
        "Two-sided clipping (INTELLECT-2, TRL's name): the unclipped policy ratio is capped at "
        "delta too, so a negative advantage cannot push a ratio that grew far above 1 further. "
        "None: off. Must exceed 1 + epsilon_high (the report uses 4). Only for the losses "
        "with the PPO clip: 'grpo', 'dr_grpo', 'dapo', 'luspo'.",
    )
    use_bias_correction_kl: bool = _knob(
        True, "Multiply the k3 KL by the policy ratio (TRL's default); false: the plain k3 KL."
    )
    off_policy_mask_threshold: float | None = _knob(
        None,
        "Off-policy sequence masking (DeepSeek-V3.2, TRL's name): samples with a negative "
        "advantage whose mean (engine logp - policy logp) over their trained tokens exceeds "
        "it are left out of the policy term. None: off. E.g. 0.5.",
    )
    entropy_coef: float = _knob(
        0.0,
        "Entropy bonus (TRL's name): subtract entropy_coef x the mean entropy of the tokens the "
        "policy term trains, to keep the policy from collapsing. 0: none. >= 0. With "
        "use_adaptive_entropy, the starting coefficient.",
    )
    use_adaptive_entropy: bool = _knob(
        False,
        "Adaptive entropy control (Skywork-OR1, TRL's name): after each optimiser step, raise "
        "entropy_coef by entropy_coef_delta when the trained tokens' mean entropy was at or "
        "below entropy_target, else lower it; the bonus applies only while the last step's "
        "entropy was at or below the target. Checkpoints keep the coefficient; "
        "`loss/entropy_coef` logs the one each step applied.",
    )
    entropy_coef_min: float = _knob(
        0.0, "Lowest coefficient adaptive entropy control goes to (TRL's name)."
    )
    entropy_coef_max: float = _knob(
        1.0, "Highest coefficient adaptive entropy control goes to (TRL's name)."
    )
    entropy_coef_delta: float = _knob(
        0.005, "Step of adaptive entropy control's coefficient per optimiser step (TRL's name)."
    )
    entropy_target: float = _knob(
        0.2,
        "Mean per-token entropy (nats) adaptive entropy control holds the policy above, "
        "measured over the tokens the policy term trains (TRL's name and default, which "
        "engages only on near-total collapse: set it near the `loss/entropy` of early steps).",
    )
    top_entropy_quantile: float = _knob(
        1.0,
        "Train only on the top share of trained tokens by entropy (rho of 'Beyond the 80/20 "
        "Rule', which recommends 0.2; TRL's name); in [0, 1], 1.0 keeps all. The quantile is "
        "taken over each forward pass's trained tokens, as TRL takes it over each micro-batch; "
        "the KL term and the loss's normalisers still count every trained token.",
    )
    mask_truncated_completions: bool = _knob(
        False,
        "Leave cut-off episodes out of the loss: those that ended truncated (the turn limit, "
        "the token budget or the context) or whose last turn stopped at its token limit. "
        "Their rewards still count in their groups' statistics (DAPO's overlong filtering, "
        "TRL's name). The cost: a policy can then escape a bad score by running out its turns "
        "or tokens; `rollout/masked_truncated_episodes` counts them.",
    )
    resample_zero_variance_groups: bool = _knob(
        False,
        "Replay groups whose rewards are all equal (no learning signal) with new tasks, once, "
        "before training on the step. They are reported either way.",
    )
    seed: int = _knob(
        42,
        f"Seed of data order, episode seeds, LoRA init and sampling; 0 <= seed < 2**31 "
        f"({SEED_LIMIT}), so every seed derived from it fits torch's.",
    )

    # --- LoRA -----------------------------------------------------------------------------
    lora_r: int = _knob(16, f"LoRA rank; one of vLLM's servable ranks {VLLM_LORA_RANKS}.")
    lora_alpha: float = _knob(32.0, "LoRA scaling numerator (scale = lora_alpha / lora_r); > 0.")
    lora_dropout: float = _knob(
        0.0,
        "Dropout on the LoRA input, in [0, 1). Non-zero makes trainer logprobs noisy against "
        "the engine's, which inflates IS weights.",
    )
    lora_target_modules: str | list[str] = _knob(
        "all-linear",
        "Modules that get adapters: 'all-linear' (PEFT: every linear layer except the output "
        "head) or a list of module names. lm_head and embed_tokens cannot be served by vLLM.",
    )
    load_in_4bit: bool = _knob(
        False, "QLoRA: load the base model in 4-bit (needs bitsandbytes and a CUDA device)."
    )
    device: Device = _knob(
        "auto", "Where the trainer runs: 'cuda', 'cpu', or 'auto' (cuda when available)."
    )
    dtype: Dtype = _knob(
        "auto",
        "Trainer weights dtype: 'auto' is bfloat16 on CUDA, float32 on CPU. float16 needs CUDA.",
    )

    # --- SFT warm start -------------------------------------------------------------------
    sft_steps: int = _knob(
        0,
        "Optimiser steps of SFT on the env's scripted/oracle trajectories before GRPO, loss on "
        "assistant tokens only. 0: no warm start.",
    )
    sft_method: SFTMethod = _knob(
        "full",
        "'full' trains every weight (the quickstart's randomly initialised tiny model learns "
        "a tool-call format no low-rank delta on random weights holds); 'lora' trains an "
        "adapter of rank lora_r and scale lora_alpha / lora_r on every linear layer and merges "
        "it into the saved weights: a pretrained model's warm start in a fraction of the "
        "optimiser memory. GRPO then trains a fresh adapter on the merged model either way.",
    )
    sft_learning_rate: float = _knob(1e-4, "Peak SFT learning rate (AdamW, linear warm-up).")
    sft_batch_size: int = _knob(8, "Trajectories per SFT optimiser step.")
    sft_num_traces: int = _knob(
        64, "Scripted trajectories built for SFT, from the first train tasks, cycled over."
    )
    sft_scripts: dict[str, float] = _knob(
        {"reference": 1.0},
        "Shares of the SFT traces played by each of the env's scripted behaviours (env "
        "methods <name>_turns). The default imitates the oracle only. A mix such as "
        "{reference: 0.3, estimate: 0.7} on the calculator imitates an agent that used the tool "
        "in 30% of its answers: it learns the skills but leaves the decision to use the tool "
        "to GRPO. Reference traces that fail are dropped; other scripts' traces are kept.",
    )
    sft_target_accuracy: float | None = _knob(
        None,
        "Stop the warm start early once this share of validation traces is reproduced token "
        "for token under teacher forcing (a lower bound on greedy success). The validation "
        f"traces are the last {SFT_VALIDATION_TASKS} train tasks, kept out of the SFT data (so "
        "train_tasks needs more than that); eval tasks are never used. None: run all sft_steps.",
    )
    sft_eval_every: int = _knob(25, "SFT steps between validation measurements (>= 1).")

    # --- run, logging, checkpoints --------------------------------------------------------
    output_dir: str = _knob(
        "runs/grpo",
        "Run folder: resolved config, metrics JSONL, eval trajectories, checkpoints, logs.",
    )
    max_steps: int = _knob(
        100,
        "GRPO steps to train (after the sft_steps of the warm start). Each step makes "
        "num_iterations optimiser updates (TRL's max_steps counts updates: divide it by "
        "num_iterations).",
    )
    logging_steps: int = _knob(
        1,
        "Send metrics to the report_to trackers every N steps (and at the last step and every "
        "eval); metrics.jsonl keeps every step.",
    )
    log_completions: bool = _knob(
        False,
        "Write the training episodes of every logged step (see logging_steps) to rollouts.jsonl "
        "in the run folder: conversations, rewards, scores and outcomes, without token ids. "
        "To read what the policy does for its reward, where a reward hack shows first.",
    )
    eval_steps: int | None = _knob(
        25, "Evaluate on held-out tasks every N steps (and before and after training). "
        "None: only before and after."
    )
    save_steps: int | None = _knob(
        25, "Checkpoint every N steps (and at the end). None: only at the end."
    )
    save_total_limit: int | None = _knob(
        2,
        "Checkpoints kept: the newest N (each is the adapter, optimizer and RNG state). None: "
        "every one, so `agentgym export --step` can take an earlier step that evaluated better.",
    )
    report_to: list[str] = _knob(
        ["auto"],
        "Trackers for metrics besides the JSONL: any of 'tensorboard', 'trackio', 'wandb', each "
        "once (a named one must be installed: checked before the run folder is made); 'auto' "
        "(each that is installed) or 'none'. An empty list [] means 'none'; a string is read as "
        "a comma-separated list ('tensorboard,trackio').",
    )

    def __post_init__(self) -> None:
        if isinstance(self.report_to, str):  # `--set report_to=tensorboard,trackio` names two
            self.report_to = [name.strip() for name in self.report_to.split(",")]
        if self.report_to == []:
            self.report_to = ["none"]
        if isinstance(self.output_dir, str) and self.output_dir.startswith("~"):
            # `--set output_dir=~/runs/x` made a folder named "~" where the docs and every
            # reader of a run (runs doctor, export) take "~" as home
            self.output_dir = os.path.expanduser(self.output_dir)
        for rule in CONFIG_RULES:  # each raises ConfigError naming the fix, or warns
            rule(self)
        self._checked = self.to_dict()

    def recheck(self) -> None:
        """Check the knobs again if one was set since the config was made; `GRPOTrainer` does.

        Why: TRL users set knobs on the object (``config.loss_type = "bnpo"``), which no check
        saw: that run trained with the dapo loss while its config.yaml said bnpo.
        """
        if self.to_dict() != self._checked:
            self.__post_init__()

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GRPOConfig:
        """Build from a mapping (a parsed YAML file); unknown keys raise with a suggestion.

        Numeric strings given for float knobs become floats: PyYAML (YAML 1.1) reads ``1e-5``
        as the string ``'1e-5'``.

        Raises:
            ConfigError: an unknown key, a value of the wrong type, or a broken rule.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"a config must be a mapping of knob: value, got {type(data).__name__}; "
                "write one 'name: value' per line"
            )
        hints = typing.get_type_hints(cls)
        known = _known_knobs(data, stacklevel=3)
        return cls(**{key: _yaml_float(value, hints[key]) for key, value in known.items()})

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Mapping[str, Any] | None = None) -> GRPOConfig:
        """Read a YAML file of ``knob: value`` lines; ``overrides`` (e.g. from the CLI) win.

        Raises:
            ConfigError: the file is missing or not YAML, or see `from_dict`.
        """
        from agentgym._yaml import load_yaml

        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config {str(path)!r}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config {str(path)!r} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
            ) from None
        data = load_yaml(text, f"config {str(path)!r}") or {}
        if isinstance(data, Mapping):
            data = _overridden(dict(data), overrides or {}, cls.defaults())
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """Every knob and its value, JSON/YAML-ready; `from_dict` rebuilds an equal config."""
        return dataclasses.asdict(self)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every knob's default (what a run saved before a knob existed is resumed with)."""
        return {f.name: _default_of(f) for f in dataclasses.fields(cls)}

    @classmethod
    def help(cls, name: str) -> str:
        """The help text of knob ``name``."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if name not in fields:
            raise ConfigError(f"no knob named {name!r}")
        return str(fields[name].metadata["help"])

    # --- derived values -------------------------------------------------------------------

    @property
    def episodes_per_step(self) -> int:
        """Episodes played per step: ``tasks_per_step * num_generations``."""
        return self.tasks_per_step * self.num_generations

    @property
    def run_env_kwargs(self) -> dict[str, Any]:
        """The kwargs the run makes its env with (preflight checks the env the run plays).

        `env_kwargs`, plus `max_turns` and `max_episode_tokens` where they are set.
        """
        kwargs = dict(self.env_kwargs)
        if self.max_turns is not None:
            kwargs["max_turns"] = self.max_turns
        if self.max_episode_tokens is not None:
            kwargs["max_episode_tokens"] = self.max_episode_tokens
        return kwargs

    @property
    def warmup_step_count(self) -> int:
        """`warmup_steps` in steps: a share of `max_steps` rounds up, as in transformers."""
        if 0 < self.warmup_steps < 1:
            return math.ceil(self.warmup_steps * self.max_steps)
        return int(self.warmup_steps)

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of GRPO step ``step`` (1-based) under `lr_scheduler_type`.

        Transformers' schedules, read per step (``step - 1`` steps taken, as its scheduler
        counts): a step's rate depends on nothing else but `max_steps` (decay, a share of
        warm-up), so a resumed run needs no scheduler state; a resume may not change
        `max_steps` where it matters (``_run_dir._refuse_rescheduled``).
        ``tests/trainers/test_config.py`` checks it against ``transformers.get_scheduler``.
        """
        warmup, taken = self.warmup_step_count, step - 1
        if self.lr_scheduler_type == "constant":
            return self.learning_rate
        if taken < warmup:
            return self.learning_rate * taken / max(1, warmup)
        if self.lr_scheduler_type == "constant_with_warmup":
            return self.learning_rate
        progress = (taken - warmup) / max(1, self.max_steps - warmup)
        if self.lr_scheduler_type == "linear":
            return self.learning_rate * max(0.0, 1.0 - progress)
        return self.learning_rate * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    def task_split(self, task_count: int | None) -> tuple[list[int], list[int]]:
        """The (train, eval) task indices for an env with ``task_count`` tasks.

        ``task_count`` None (the env is not known yet) checks only the ranges given and
        leaves a None one empty.

        Raises:
            ConfigError: a malformed or overlapping range, one past the env's last task, or
                too few tasks for `tasks_per_step` / `eval_num_tasks`.
        """
        given = {"train_tasks": self.train_tasks, "eval_tasks": self.eval_tasks}
        train, held_out = (None if v is None else parse_tasks(v, k) for k, v in given.items())
        if task_count is not None:
            if held_out is None:
                taken = set(train or ())
                free = [i for i in range(task_count) if i not in taken]
                held_out = free[: min(DEFAULT_EVAL_TASKS, max(1, task_count // 10))]
            if train is None:
                evaluated = set(held_out)
                train = [i for i in range(task_count) if i not in evaluated]
            reach = max([*train, *held_out], default=-1)
            if reach >= task_count:
                raise ConfigError(
                    f"train_tasks/eval_tasks reach task {reach} but {self.env!r} has "
                    f"{task_count} tasks; shrink the ranges, leave them unset (null) to split "
                    "the env's tasks, or pass a larger num_tasks in env_kwargs"
                )
        check_split(self, train, held_out)
        return train or [], held_out or []

    def sft_split(self, train_tasks: list[int]) -> tuple[list[int], list[int]]:
        """The SFT warm start's (trace, validation) tasks out of ``train_tasks``.

        With `sft_target_accuracy` the last `SFT_VALIDATION_TASKS` train tasks validate (kept
        out of the traces: a stopping rule tuned on eval tasks would leak them), and the first
        `sft_num_traces` of the others are played as traces.
        """
        traces, validation = (split_off_validation(train_tasks) if self.sft_target_accuracy
                              else (train_tasks, []))  # fmt: skip
        return traces[: self.sft_num_traces], validation


def _yaml_float(value: Any, hint: Any) -> Any:
    """``value`` as a float when it is a numeric string and ``hint`` accepts floats."""
    if isinstance(value, str) and matches(1.5, hint) and not matches(value, hint):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _render_help(cls: type) -> str:
    """The per-knob section of the class docstring, from each field's metadata."""
    lines = ["", "    Knobs (name: type = default: help):", ""]
    for f in dataclasses.fields(cls):
        lines.append(f"        {f.name}: {f.type} = {_default_of(f)!r}")
        lines.append(f"            {f.metadata['help']}")
    return "\n".join(lines)


def _known_knobs(knobs: Mapping[str, Any], stacklevel: int) -> dict[str, Any]:
    """``knobs`` with TRL's deprecated names renamed (a FutureWarning each), unknown ones refused.

    One place for `GRPOConfig.from_dict` and the constructor: the dataclass's own ``__init__``
    raised a bare ``TypeError`` (no closest knob, no TRL hint), so a TRL user writing
    ``GRPOConfig(per_device_train_batch_size=8)`` in the README's Python form learnt less than
    one writing it in YAML. ``stacklevel`` points the warning at the user's line.
    """
    names = [f.name for f in dataclasses.fields(GRPOConfig)]
    known: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in knobs.items():
        if key in _RENAMED:
            warnings.warn(
                f"config key {key!r} is deprecated (as in TRL); use {_RENAMED[key]!r}",
                FutureWarning,
                stacklevel=stacklevel,
            )
            key = _RENAMED[key]
        if key not in names or key.startswith("_"):
            unknown.append(key)
            continue
        if key in known:
            raise ConfigError(f"config key {key!r} is given twice (once by its deprecated name)")
        known[key] = value
    if unknown:
        raise _unknown_knobs(unknown, names)
    return known


def _refusing_unknown_keywords(init: Any) -> Any:
    """``GRPOConfig(...)`` refuses unknown keywords as `from_dict` does (`_known_knobs`)."""

    @functools.wraps(init)
    def __init__(self: GRPOConfig, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **_known_knobs(kwargs, stacklevel=3))

    return __init__


GRPOConfig.__init__ = _refusing_unknown_keywords(GRPOConfig.__init__)  # type: ignore[method-assign]
GRPOConfig.__doc__ = (GRPOConfig.__doc__ or "") + _render_help(GRPOConfig)


def _overridden(
    data: dict[str, Any], overrides: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """``data`` with ``overrides`` applied; a dotted key sets one entry of a mapping knob.

    Why dotted keys: ``--set env_kwargs.parser=mistral`` is what a user types to change one
    env option; it was refused as an unknown key, and the whole mapping had to be retyped.
    The knob's other entries (from the file, else its default) are kept. A dotted key whose
    first part is no knob is left as it is, so `from_dict` names the closest knob.
    """
    for key, value in overrides.items():
        knob, _, path = key.partition(".")
        if not path or knob not in defaults:
            data[key] = value
            continue
        data[knob] = _set_path(data.get(knob, defaults[knob]), path.split("."), value, knob)
    return data


def _set_path(mapping: Any, path: list[str], value: Any, where: str) -> dict[str, Any]:
    """A copy of ``mapping`` with ``value`` at ``path`` (nested mappings made as needed)."""
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, Mapping):
        raise ConfigError(
            f"--set {where}.{'.'.join(path)}: {where} is {type(mapping).__name__}, not a "
            f"mapping; set it whole (--set {where}=...)"
        )
    head, rest = path[0], path[1:]
    return {**mapping, head: _set_path(mapping.get(head), rest, value, f"{where}.{head}")
            if rest else value}  # fmt: skip
