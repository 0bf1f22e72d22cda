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

_ENGINE = "set rollout_engine: vllm (in process, the default) or hf, or rollout_servers: [URL]"
_EVERY_N = "set eval_steps / save_steps / logging_steps (every N GRPO steps; null: never)"
_SAMPLING = "the sampling knobs are temperature, top_p, top_k and min_p"
_REFERENCE = "the KL reference is the base model with the adapter disabled (set beta)"
_RUN_FOLDER = "output_dir is the run folder: config, logs, metrics and checkpoints"
_COMPLETIONS = "set log_completions: the logged steps' episodes go to rollouts.jsonl"
_SERVERS = "set rollout_servers: [http://HOST:PORT]"
_EXPORT = "agentgym export RUN_DIR writes the adapter or a merged model to upload"
_DATASET = "tasks come from the env: set env, train_tasks and eval_tasks"
_ADAM = "the optimiser is AdamW with torch's betas and eps: set learning_rate and weight_decay"
_QUANT = "the one quantised loading is QLoRA's 4-bit: set load_in_4bit"
_PLAIN_LORA = (
    "adapters are plain LoRA, as vLLM serves them: set lora_r, lora_alpha, lora_target_modules"
)
_MULTI_GPU = "more GPUs: torchrun, one rank each (docs/trainer.md, Several processes)"
_NO_KNOB = "no knob does that (docs/trainer.md, Coming from TRL, lists what carries over)"

#: TRL key -> what to set here instead (one clause, no trailing period).
TRL_KEYS: dict[str, str] = {
    "per_device_train_batch_size": "a step plays tasks_per_step x num_generations episodes, "
    "where TRL's plays this x gradient_accumulation_steps x processes completions: set "
    "tasks_per_step to that product / num_generations (micro_batch_tokens bounds a pass's "
    "memory)",
    "generation_batch_size": "a step plays tasks_per_step x num_generations episodes, TRL's "
    "generation batch: set tasks_per_step to this / num_generations",
    "per_device_eval_batch_size": "evals play every held-out task at once (eval_num_tasks)",
    "steps_per_generation": "each step rolls out its own episodes; num_iterations reuses them "
    "for more optimiser steps",
    "num_train_epochs": "set max_steps (GRPO steps)",
    "max_prompt_length": "prompts grow with every turn: set max_episode_tokens (sampled "
    "tokens per episode) and max_model_len (the context)",
    "max_tool_calling_iterations": "set max_turns to it + 1 (the answer turn after the last "
    "tool results)",
    "use_vllm": _ENGINE,
    "vllm_mode": _ENGINE,
    "vllm_server_base_url": _SERVERS,
    "vllm_server_host": _SERVERS,
    "vllm_server_port": _SERVERS,
    "vllm_max_model_length": "set max_model_len",
    "vllm_tensor_parallel_size": "one GPU per engine; more GPUs: torchrun, one rank each",
    "bf16": "set dtype: bfloat16 ('auto' is bfloat16 on CUDA, float32 on the CPU)",
    "fp16": "set dtype: float16 (CUDA only)",
    "use_cpu": "set device: cpu",
    "model_name_or_path": "set model (a folder, or 'tiny' for the model made locally)",
    "use_peft": "LoRA is always on: set lora_r, lora_alpha, lora_dropout",
    "dataset_name": _DATASET,
    "dataset_config": _DATASET,
    "dataset_train_split": _DATASET,
    "dataset_test_split": _DATASET,
    "dataset_streaming": _DATASET,
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
    "hub_strategy": _EXPORT,
    "hub_private_repo": _EXPORT,
    "hub_token": _EXPORT,
    "optim": _ADAM,
    "optim_args": _ADAM,
    "adam_beta1": _ADAM,
    "adam_beta2": _ADAM,
    "adam_epsilon": _ADAM + " (our epsilon is the policy-ratio clip, not Adam's)",
    "model_init_kwargs": "set dtype (and load_in_4bit): how the model loads",
    "load_in_8bit": _QUANT,
    "bnb_4bit_quant_type": _QUANT,
    "bnb_4bit_quant_storage": _QUANT,
    "use_bnb_nested_quant": _QUANT,
    "use_dora": _PLAIN_LORA,
    "use_rslora": _PLAIN_LORA,
    "lora_target_parameters": _PLAIN_LORA,
    "lora_modules_to_save": _PLAIN_LORA,
    "lora_task_type": "the adapter is always a causal-LM one",
    "deepspeed": _MULTI_GPU,
    "fsdp": _MULTI_GPU,
    "fsdp_config": _MULTI_GPU,
    "auto_find_batch_size": "set micro_batch_tokens to bound a pass's memory",
    "eval_on_start": "the eval before training always runs; eval_steps sets the later ones",
    "load_best_model_at_end": _EXPORT + " (--best: the best-evaluated checkpoint)",
    "metric_for_best_model": _EXPORT + " (--best: the best-evaluated checkpoint)",
    "data_seed": "seed sets the data order too",
    "lr_scheduler_kwargs": "set lr_scheduler_type and warmup_steps (no other schedule arguments)",
    "torch_compile": "the trainer's model is not compiled (rollout_compile is the CPU rollout "
    "engine's)",
    "vllm_model_impl": _ENGINE,
    "vllm_enable_sleep_mode": _ENGINE,
    "vllm_server_timeout": _SERVERS,
    "log_unique_prompts": _COMPLETIONS,
    "log_multimodal": _COMPLETIONS,
    "sync_ref_model": _REFERENCE,
    "ref_model_sync_steps": _REFERENCE,
    "ref_model_mixup_alpha": _REFERENCE,
    "repetition_penalty": _SAMPLING,
    "generation_kwargs": _SAMPLING,
    "num_completions_to_print": _COMPLETIONS,
    "log_completions_hub_repo": _COMPLETIONS,
}


#: The other keys of TRL 1.16's GRPOConfig (with transformers' TrainingArguments), ModelConfig
#: and ScriptArguments: none has a knob here, and the closest spelling of one names an unrelated
#: knob (``deepspeed`` -> ``seed``, ``eval_delay`` -> ``eval_tasks``), so they say so instead.
TRL_KEYS_WITHOUT_KNOB: frozenset[str] = frozenset({
    "accelerator_config", "attn_implementation", "average_tokens_across_devices",
    "batch_eval_metrics", "bf16_full_eval", "cache_implementation", "cast_lm_head_to_fp32",
    "dataloader_drop_last", "dataloader_in_order", "dataloader_multiprocessing_context",
    "dataloader_num_workers", "dataloader_persistent_workers", "dataloader_pin_memory",
    "dataloader_prefetch_factor", "ddp_backend", "ddp_broadcast_buffers", "ddp_bucket_cap_mb",
    "ddp_find_unused_parameters", "ddp_static_graph", "ddp_timeout", "debug", "disable_dropout",
    "disable_tqdm", "do_eval", "do_predict", "do_train", "ds3_gather_for_generation",
    "enable_jit_checkpoint", "eval_accumulation_steps", "eval_delay", "eval_do_concat_batches",
    "eval_use_gather_object", "fp16_full_eval", "full_determinism",
    "gradient_checkpointing_kwargs", "greater_is_better", "hub_always_push", "hub_revision",
    "ignore_bias_buffers", "ignore_data_skip", "include_for_metrics",
    "include_num_input_tokens_seen", "label_names", "label_smoothing_factor",
    "length_column_name", "liger_kernel_config", "local_rank", "log_level", "log_level_replica",
    "log_on_each_node", "logging_first_step", "logging_nan_inf_filter", "model_revision",
    "neftune_noise_alpha", "optim_target_modules", "pad_to_multiple_of", "parallelism_config",
    "prediction_loss_only", "project", "remove_unused_columns",
    "restore_callback_states_from_checkpoint", "router_aux_loss_coef", "save_on_each_node",
    "save_only_model", "skip_memory_metrics", "tf32", "torch_compile_backend",
    "torch_compile_mode", "torch_empty_cache_steps", "trackio_bucket_id", "trackio_space_id",
    "trackio_static_space_id", "train_sampling_strategy",
    "transformers_continuous_batching_config", "trust_remote_code", "use_cache",
    "use_liger_kernel", "use_transformers_continuous_batching", "use_transformers_paged",
    "vllm_group_port", "vllm_structured_outputs_regex",
})  # fmt: skip


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
    hint = TRL_KEYS.get(key) or (_NO_KNOB if key in TRL_KEYS_WITHOUT_KNOB else None)
    return f"it is TRL's; here {hint}" if hint else None
