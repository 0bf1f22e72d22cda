"""Keys of a TRL training config that have no knob of the same name here, and what to set.

Users port TRL ``GRPOConfig`` files (and the ``ModelConfig``/``TrainingArguments`` keys their
scripts take), some written for releases before TRL 1.16 and transformers 5
(``max_prompt_length``, ``warmup_ratio``, ``logging_dir``). A knob that means the same thing
keeps TRL's name (docs/trainer.md lists them); the keys below either name the same idea
differently or have no place in a loop that plays multi-turn episodes, and an unknown-key
error then names the fix instead of the closest spelling (which for
``generation_batch_size`` was ``sft_batch_size``).
"""

from __future__ import annotations

_STEP_SIZE = (
    "a step plays tasks_per_step x num_generations episodes: set tasks_per_step "
    "(micro_batch_tokens bounds a pass's memory)"
)
_ENGINE = "set rollout_engine: vllm (in process, the default) or hf, or rollout_servers: [URL]"
_EVERY_N = "set eval_steps / save_steps / logging_steps (every N GRPO steps; null: never)"
_SAMPLING = "the sampling knobs here are temperature, top_p, top_k and min_p"
_REFERENCE = "the KL reference is the base model with the adapter disabled (set beta)"
_RUN_FOLDER = "output_dir is the run folder: config, logs, metrics and checkpoints"
_COMPLETIONS = "set log_completions: the logged steps' episodes go to rollouts.jsonl"
_SERVERS = "set rollout_servers: [http://HOST:PORT]"
_EXPORT = "agentgym export RUN_DIR writes the adapter or a merged model to upload"

#: TRL key -> what to set here instead (one clause, no trailing period).
TRL_KEYS: dict[str, str] = {
    "per_device_train_batch_size": _STEP_SIZE,
    "generation_batch_size": _STEP_SIZE,
    "per_device_eval_batch_size": "evals play every held-out task at once (eval_num_tasks)",
    "steps_per_generation": "each step rolls out its own episodes; num_iterations reuses them "
    "for more optimiser steps",
    "num_train_epochs": "set max_steps (GRPO steps)",
    "max_prompt_length": "prompts grow with every turn: set max_episode_tokens (sampled "
    "tokens per episode) and max_model_len (the context)",
    "max_tool_calling_iterations": "set max_turns",
    "use_vllm": _ENGINE,
    "vllm_mode": _ENGINE,
    "vllm_server_base_url": _SERVERS,
    "vllm_server_host": _SERVERS,
    "vllm_server_port": _SERVERS,
    "vllm_max_model_length": "set max_model_len",
    "vllm_tensor_parallel_size": "one GPU per engine here; more GPUs: torchrun, one rank each",
    "bf16": "set dtype: bfloat16 ('auto' is bfloat16 on CUDA, float32 on the CPU)",
    "fp16": "set dtype: float16 (CUDA only)",
    "use_cpu": "set device: cpu",
    "model_name_or_path": "set model (a folder, or 'tiny' for the model made locally)",
    "use_peft": "LoRA is always on here: set lora_r, lora_alpha, lora_dropout",
    "dataset_name": "tasks come from the env: set env, train_tasks and eval_tasks",
    "reward_funcs": "rewards come from the env's rubric: register an env with your reward",
    "reward_weights": "rewards come from the env's rubric, which holds their weights",
    "num_generations_eval": "evals play each held-out task once, greedily (eval_tasks, "
    "eval_num_tasks)",
    "warmup_ratio": "set warmup_steps to a share of max_steps below 1, e.g. 0.1",
    "eval_strategy": _EVERY_N,
    "save_strategy": _EVERY_N,
    "logging_strategy": _EVERY_N,
    "resume_from_checkpoint": "run agentgym train CONFIG --resume (GRPOTrainer(config, "
    "resume=True))",
    "run_name": _RUN_FOLDER,
    "logging_dir": _RUN_FOLDER,
    "push_to_hub": _EXPORT,
    "hub_model_id": _EXPORT,
    "optim": "the optimiser is AdamW: set learning_rate and weight_decay",
    "sync_ref_model": _REFERENCE,
    "ref_model_sync_steps": _REFERENCE,
    "ref_model_mixup_alpha": _REFERENCE,
    "repetition_penalty": _SAMPLING,
    "generation_kwargs": _SAMPLING,
    "num_completions_to_print": _COMPLETIONS,
    "log_completions_hub_repo": _COMPLETIONS,
}


#: (knob, TRL value) -> what to write here instead, for values TRL takes and this knob does not.
TRL_VALUES: dict[tuple[str, object], str] = {
    ("loss_type", "bnpo"): "TRL's 'bnpo' divides by each micro-batch's tokens, which here would "
    "hang on how the trainer cuts a step into passes; use 'dapo', the step's tokens (bnpo "
    "with one micro-batch)",
    ("scale_rewards", True): "TRL's older spelling of 'group'; write 'group'",
    ("scale_rewards", False): "TRL's older spelling of 'none'; write 'none'",
}


def trl_value_hint(knob: str, value: object) -> str | None:
    """What to write instead of a value TRL takes for ``knob``, or None."""
    if not isinstance(value, (str, bool)):  # the table's values; a list would not hash
        return None
    return TRL_VALUES.get((knob, value))


def trl_key_hint(key: str) -> str | None:
    """What to set instead of TRL's ``key``, or None when it is not one of TRL's keys."""
    hint = TRL_KEYS.get(key)
    return f"it is TRL's; here {hint}" if hint else None
