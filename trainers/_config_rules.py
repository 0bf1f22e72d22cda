"""The rules `GRPOConfig` checks when it is built, each raising `ConfigError` with the fix.

They run in `CONFIG_RULES` order before any model loads or container starts: types first
(later rules compare values), then finite numbers, ranges, cross-field rules, the schedule and
the output folder; last, warnings for settings that run but are likely mistakes. `preflight`
runs `check_device` once more for the device ``auto`` resolves to on the machine.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
import urllib.parse
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from agentgym._errors import ConfigError

from ._trl_keys import trl_value_hint

if TYPE_CHECKING:
    from ._config import GRPOConfig

#: LoRA ranks vLLM can serve (``max_lora_rank`` choices in ``vllm/config/lora.py``).
VLLM_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: Modules vLLM cannot hot-load as LoRA targets, so an adapter on them cannot be synced alone.
UNSERVABLE_TARGETS = frozenset({"lm_head", "embed_tokens"})
REPORT_TO = ("auto", "none", "tensorboard", "trackio", "wandb")
#: Learning rates below this are full-weight ones, which LoRA barely learns at (a warning).
LOWEST_LORA_RATE = 3e-6
#: Seeds are below this: the trainer derives others from it (``seed * 1_000_003 + step *
#: episodes_per_step`` in trainers/_grpo.py) that must fit torch's 64-bit seed.
SEED_LIMIT = 2**31
#: The most episodes of a task, or tasks, a step may take; and the most steps of a run.
COUNT_LIMIT = 2**31 - 1
STEP_LIMIT = 10**15
#: Train tasks the SFT warm start holds back for validation when `sft_target_accuracy` is set:
SFT_VALIDATION_TASKS = 128


def split_off_validation(tasks: Sequence[int]) -> tuple[list[int], list[int]]:
    """(trace tasks, validation tasks): the last `SFT_VALIDATION_TASKS` validate a warm start.

    Why held out of the traces, and out of the eval tasks: a stopping rule measured on what it
    trains on reads memory, and one tuned on the eval tasks would leak them.
    """
    validation = list(tasks[-SFT_VALIDATION_TASKS:])
    held_back = set(validation)
    return [t for t in tasks if t not in held_back], validation


#: Knobs that only rollout servers read, with the value that means "not set".
SERVER_ONLY: dict[str, Any] = {
    "rollout_model_name": None, "adapter_storage": None, "on_server_failure": "retry",
}  # fmt: skip


def check_types(config: GRPOConfig) -> None:
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if not matches(value, hints[f.name]):
            raise ConfigError(
                f"{f.name}={value!r} ({type(value).__name__}) is not a valid "
                f"{_describe(hints[f.name])}; "
                f"{trl_value_hint(f.name, value) or f.metadata['help']}"
            )


def check_finite(config: GRPOConfig) -> None:
    """NaN or inf in any float knob (``epsilon_high: .nan`` trained on to a NaN loss)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            default = "null" if f.default is None else repr(f.default)
            unset = " or null (see its help)" if "None" in str(f.type) else ""
            raise ConfigError(
                f"{f.name}={value!r} is not a finite number; use a finite number{unset} "
                f"(the default is {default})"
            )


def check_ranges(config: GRPOConfig) -> None:
    rules: list[tuple[str, bool, str]] = [
        ("num_generations", config.num_generations >= 2,
         "GRPO compares episodes of a task; set it to 2 or more"),
        ("tasks_per_step", config.tasks_per_step >= 1, "set it to 1 or more"),
        # a number past these passed the checks and crashed the plan (OverflowError) or ran
        *((name, getattr(config, name) <= most, f"use at most {most:,}")
          for name, most in (("num_generations", COUNT_LIMIT), ("tasks_per_step", COUNT_LIMIT),
                             ("max_steps", STEP_LIMIT))),
        ("max_completion_length", config.max_completion_length >= 1, "set it to 1 or more"),
        ("max_episode_tokens",
         config.max_episode_tokens is None or config.max_episode_tokens >= 1,
         "set it to 1 or more, or null for no budget but max_model_len"),
        ("seed", 0 <= config.seed < SEED_LIMIT,
         f"use 0 <= seed < 2**31 ({SEED_LIMIT}): the trainer derives seeds such as "
         "seed * 1_000_003 + step * episodes_per_step that must fit torch's 64-bit seed"),
        ("sft_target_accuracy",
         config.sft_target_accuracy is None or 0 < config.sft_target_accuracy <= 1,
         "use a share in (0, 1], or null to run all sft_steps"),
        ("sft_eval_every", config.sft_eval_every >= 1, "set it to 1 or more"),
        ("max_model_len", config.max_model_len > config.max_completion_length,
         "the context must hold a prompt and a full turn; raise it above "
         "max_completion_length"),
        ("max_turns", config.max_turns is None or config.max_turns >= 1,
         "set it to 1 or more, or null for the env's own"),
        ("temperature", config.temperature > 0,
         "logits are divided by it; use 1.0 (greedy decoding is not GRPO)"),
        ("top_p", 0 < config.top_p <= 1, "use a value in (0, 1]; 1.0 disables it"),
        ("top_k", config.top_k >= 0, "use 0 to disable it"),
        ("min_p", config.min_p is None or 0 <= config.min_p <= 1, "use [0, 1] or null"),
        ("max_concurrency", config.max_concurrency is None or config.max_concurrency >= 1,
         "set it to 1 or more, or null"),
        ("max_staleness", config.max_staleness in (0, 1),
         "use 0 (on-policy) or 1 (the next step rolls out while this one trains)"),
        ("infra_error_patience",
         config.infra_error_patience is None or config.infra_error_patience >= 1,
         "set it to 1 or more steps, or null to never stop"),
        ("episode_deadline_s", config.episode_deadline_s is None or config.episode_deadline_s > 0,
         "use seconds > 0, or null to wait for every episode"),
        ("learning_rate", config.learning_rate > 0, "use a positive rate, e.g. 1e-5"),
        ("weight_decay", config.weight_decay >= 0, "use 0.0 (none) or a small positive value"),
        ("warmup_steps",
         config.warmup_steps >= 0 and (config.warmup_steps < 1 or config.warmup_steps % 1 == 0),
         "use a whole number of steps, or a share of max_steps in (0, 1)"),
        ("sft_learning_rate", config.sft_learning_rate > 0, "use a positive rate, e.g. 1e-4"),
        ("beta", config.beta >= 0, "use 0.0 (no KL) or a small positive value"),
        ("delta", config.delta is None or config.delta > 1 + (
            config.epsilon if config.epsilon_high is None else config.epsilon_high),
         "use a cap above 1 + epsilon_high (the INTELLECT-2 report uses 4), or null"),
        ("off_policy_mask_threshold",
         config.off_policy_mask_threshold is None or config.off_policy_mask_threshold >= 0,
         "use a KL threshold >= 0 such as 0.5, or null"),
        ("entropy_coef", config.entropy_coef >= 0, "use 0.0 (no bonus) or a small value"),
        ("vllm_gpu_memory_utilization", 0 < config.vllm_gpu_memory_utilization <= 1,
         "use a share of the GPU in (0, 1], e.g. 0.3"),
        ("entropy_coef_max", config.entropy_coef_max >= 0, "use a value >= 0: 1.0"),
        ("entropy_coef_min", 0 <= config.entropy_coef_min <= config.entropy_coef_max,
         "use a value >= 0 and <= entropy_coef_max"),
        ("entropy_coef_delta", config.entropy_coef_delta > 0, "use a positive step: 0.005"),
        ("entropy_target", config.entropy_target >= 0, "use nats >= 0, near the early entropy"),
        ("entropy_coef", not config.use_adaptive_entropy
         or config.entropy_coef_min <= config.entropy_coef <= config.entropy_coef_max,
         "start adaptive entropy control inside [entropy_coef_min, entropy_coef_max]"),
        ("sapo_temperature_pos", config.sapo_temperature_pos > 0, "use a positive value: 1.0"),
        ("sapo_temperature_neg", config.sapo_temperature_neg > 0, "use a positive value: 1.05"),
        ("vespo_k_pos", config.vespo_k_pos >= 0, "use a value >= 0: 2.0"),
        ("vespo_k_neg", config.vespo_k_neg >= 0, "use a value >= 0: 3.0"),
        ("vespo_lambda_pos", config.vespo_lambda_pos > 0, "use a positive value: 3.0"),
        ("vespo_lambda_neg", config.vespo_lambda_neg > 0, "use a positive value: 2.0"),
        ("top_entropy_quantile", 0 <= config.top_entropy_quantile <= 1,
         "use a share in [0, 1]: 0.2 as the paper, 1.0 to train on every token"),
        ("num_iterations", config.num_iterations >= 1, "set it to 1 or more"),
        ("max_grad_norm", config.max_grad_norm is None or config.max_grad_norm > 0,
         "use a positive norm, or null for no clipping"),
        # a ratio of 1 (on-policy) inside the bounds: one outside moved or masked every token
        ("vllm_importance_sampling_clip_max",
         config.vllm_importance_sampling_clip_max is None
         or config.vllm_importance_sampling_clip_max >= 1,
         "use a cap of 1 or more (TRL uses 3.0), or null for none"),
        ("vllm_importance_sampling_clip_min",
         config.vllm_importance_sampling_clip_min is None
         or 0 <= config.vllm_importance_sampling_clip_min <= 1,
         "use a bound in [0, 1], or null"),
        ("lora_alpha", config.lora_alpha > 0, "use a positive value, e.g. 2 * lora_r"),
        ("lora_dropout", 0 <= config.lora_dropout < 1, "use a value in [0, 1)"),
        ("sft_steps", config.sft_steps >= 0, "use 0 to skip the warm start"),
        ("sft_batch_size", config.sft_batch_size >= 1, "set it to 1 or more"),
        ("sft_num_traces", config.sft_num_traces >= 1, "set it to 1 or more"),
        ("micro_batch_tokens", config.micro_batch_tokens is None or config.micro_batch_tokens >= 1,
         "use a token count such as 16384, or null for no cap"),
        ("sft_scripts",
         bool(config.sft_scripts) and all(_is_share(v) for v in config.sft_scripts.values()),
         "map script names to finite positive numbers (not true/false), e.g. "
         "{reference: 1.0}"),
    ]
    for name, ok, fix in rules:
        if not ok:
            raise ConfigError(f"{name}={getattr(config, name)!r} is out of range; {fix}")


def check_loss(config: GRPOConfig) -> None:
    if not 0 < config.epsilon < 1:
        raise ConfigError(
            f"epsilon={config.epsilon!r} must be in (0, 1): ratios below 1 - epsilon are "
            "clipped; TRL uses 0.2"
        )
    if config.epsilon_high is not None and config.epsilon_high < config.epsilon:
        raise ConfigError(
            f"epsilon_high={config.epsilon_high!r} is below epsilon={config.epsilon!r}; set "
            f"epsilon_high >= {config.epsilon} (DAPO uses 0.28) or null to equal epsilon"
        )
    if config.loss_type == "cispo" and (config.epsilon_high is None or config.epsilon_high < 1):
        raise ConfigError(
            f"loss_type='cispo' caps the policy ratio at epsilon_high, here "
            f"{config.epsilon_high or config.epsilon!r}; set epsilon_high to 1 or more (ScaleRL "
            "uses 5.0)"
        )
    if config.max_staleness and not config.vllm_importance_sampling_correction:
        raise ConfigError(
            "max_staleness=1 trains on episodes one adapter version old, and only the "
            "importance-sampling correction accounts for that; set "
            "vllm_importance_sampling_correction: true, or max_staleness: 0"
        )
    per_sequence = (config.vllm_importance_sampling_correction
                    and config.vllm_importance_sampling_mode.startswith("sequence"))  # fmt: skip
    if config.loss_type == "vespo" and per_sequence:
        raise ConfigError(
            f"loss_type='vespo' folds per-token importance ratios into its weight; "
            f"vllm_importance_sampling_mode={config.vllm_importance_sampling_mode!r} is "
            "per-sequence: use 'token_truncate' or 'token_mask'"
        )
    if per_sequence and config.vllm_importance_sampling_clip_max is None:
        # a sample's ratio multiplies all its tokens' ratios: a log-ratio sum past ~88 is an
        # inf weight, which neither mode bounds without a cap, and the loss turned NaN
        raise ConfigError(
            f"vllm_importance_sampling_mode={config.vllm_importance_sampling_mode!r} with "
            "vllm_importance_sampling_clip_max=None leaves a sample's ratio (the product of its "
            "tokens') unbounded, and a long one overflows to inf (a NaN loss); set "
            "vllm_importance_sampling_clip_max (TRL uses 3.0) or use a 'token_*' mode"
        )
    # runs, but not as the method was published, or with a knob that does nothing: warned,
    # not refused (TRL ignores those knobs silently, and a run saved with one must resume)
    for message in [*_level_mismatches(config), *_ignored_knobs(config)]:
        warnings.warn(message, UserWarning, stacklevel=5)


def _level_mismatches(config: GRPOConfig) -> list[str]:
    """Warnings for a loss type paired with the ratio level its paper does not use (as TRL's)."""
    level, loss = config.importance_sampling_level, config.loss_type
    published = {"vespo": "token", "luspo": "sequence"}  # VESPO weighs sequences itself
    mismatches = [
        f"loss_type={loss!r} with importance_sampling_level={level!r}; as published it uses "
        f"importance_sampling_level={published[loss]!r}"
    ] if loss in published and level != published[loss] else []  # fmt: skip
    if level == "sequence" and loss not in ("grpo", "sapo", "luspo", "vespo"):
        mismatches.append(
            f"importance_sampling_level='sequence' with loss_type={loss!r} sums per-token "
            "losses; GSPO as published uses loss_type='grpo'"
        )
    return mismatches


def _ignored_knobs(config: GRPOConfig) -> list[str]:
    """Knobs set where the loss or aggregation never reads them (a recipe carried over)."""
    unclipped = {"cispo": ["delta"], "sapo": ["epsilon_high", "delta"],
                 "vespo": ["epsilon_high", "delta"]}.get(config.loss_type, [])  # fmt: skip
    ignored = [  # these losses weigh the ratio without the PPO clip
        f"{name}={getattr(config, name)!r} bounds the PPO clip, which "
        f"loss_type={config.loss_type!r} does not use: it is ignored; set {name}: null, or "
        "use loss_type 'grpo', 'dr_grpo', 'dapo' or 'luspo'"
        for name in unclipped if getattr(config, name) is not None
    ]
    if config.multi_objective_aggregation == "normalize_then_sum" and \
            config.scale_rewards != "group":  # fmt: skip
        ignored.append(
            f"scale_rewards={config.scale_rewards!r} does not apply under "
            "multi_objective_aggregation='normalize_then_sum' (GDPO scales each reward in its "
            "group, then the sums over the step): it is ignored; remove it, or use "
            "'sum_then_normalize'"
        )
    return ignored


#: Trainer knobs that set the env option of the same name (`GRPOConfig.run_env_kwargs`).
_ENV_KNOBS = ("max_turns", "max_episode_tokens")


def check_env_kwargs(config: GRPOConfig) -> None:
    """Refuse an env option given both as a trainer knob and in ``env_kwargs``, differently.

    The knob won, and ``env_kwargs.max_turns: 5`` was dropped without a word.
    """
    for name in _ENV_KNOBS:
        knob, option = getattr(config, name), config.env_kwargs.get(name)
        if knob is not None and option is not None and knob != option:
            raise ConfigError(
                f"{name} is given twice, {name}: {knob!r} and env_kwargs.{name}: {option!r}; "
                f"keep one ({name} sets the env's option)"
            )


def check_tasks(config: GRPOConfig) -> None:
    config.task_split(None)


def check_split(config: GRPOConfig, train: list[int] | None, held_out: list[int] | None) -> None:
    """The checks `task_split` runs on what it knows (None: not known yet)."""
    overlap = sorted(set(train or ()) & set(held_out or ()))
    if overlap:
        raise ConfigError(
            f"train_tasks={config.train_tasks!r} and eval_tasks={config.eval_tasks!r} share "
            f"{len(overlap)} tasks (first: {overlap[0]}); make the ranges disjoint so "
            "evaluation is held out"
        )
    if held_out is not None and config.eval_num_tasks is not None:
        if not 1 <= config.eval_num_tasks <= len(held_out):
            raise ConfigError(
                f"eval_num_tasks={config.eval_num_tasks!r} must be between 1 and the "
                f"{len(held_out)} eval_tasks; lower it or null to use all"
            )
    if train is not None and not train and config.train_tasks is None:
        raise ConfigError(  # not "lower tasks_per_step": it cannot go to 0
            f"the default split held out every one of the env's {len(held_out or ())} "
            "task(s) for eval (a tenth of them, at least 1), leaving none to train on; give "
            "the env more tasks, or set train_tasks and eval_tasks"
        )
    if train is not None and config.tasks_per_step > len(train):
        raise ConfigError(
            f"tasks_per_step={config.tasks_per_step} exceeds the {len(train)} train_tasks; "
            "lower it or widen train_tasks"
        )
    if train is not None and config.sft_steps and not config.sft_split(train)[0]:
        raise ConfigError(
            f"sft_steps={config.sft_steps} leaves no train task for SFT traces: "
            f"sft_target_accuracy={config.sft_target_accuracy!r} holds back the last "
            f"{SFT_VALIDATION_TASKS} train tasks for validation and there are "
            f"{len(train)}; give train_tasks more than {SFT_VALIDATION_TASKS} tasks or set "
            "sft_target_accuracy null"
        )


def check_lora(config: GRPOConfig) -> None:
    if config.lora_r not in VLLM_LORA_RANKS:
        raise ConfigError(
            f"lora_r={config.lora_r!r} cannot be served by vLLM; use one of {VLLM_LORA_RANKS}"
        )
    targets = [config.lora_target_modules] if isinstance(config.lora_target_modules, str) \
        else config.lora_target_modules
    bad = sorted(set(targets) & UNSERVABLE_TARGETS)
    if bad or not targets:
        raise ConfigError(
            f"lora_target_modules={config.lora_target_modules!r}: vLLM cannot hot-load "
            f"adapters on {bad or 'nothing'}; use 'all-linear' or attention/MLP projections"
        )


def check_hardware(config: GRPOConfig) -> None:
    if config.device == "cpu":
        check_device(config, "cpu")


def check_device(config: GRPOConfig, device: str) -> None:
    """The rules of training on ``device``, what `device` resolves to ('cpu' or 'cuda').

    The config checks them for ``device: cpu``; `preflight` once more for the device
    ``auto`` resolves to on this machine.

    Raises:
        ConfigError: float16 or 4-bit loading on the CPU.
    """
    if device != "cpu":
        return
    where = "device='cpu'" if config.device == "cpu" else \
        f"device={config.device!r}, the CPU here (torch sees no CUDA device)"
    if config.dtype == "float16":
        raise ConfigError(
            f"dtype='float16' with {where}: CPU training in float16 is unsupported; "
            "use dtype 'float32' or 'bfloat16' (or 'auto')"
        )
    if config.load_in_4bit:
        fix = "set device 'cuda'" if config.device == "cpu" else "run on a CUDA machine"
        raise ConfigError(
            f"load_in_4bit=True with {where}: QLoRA needs bitsandbytes on CUDA; "
            f"{fix} or set load_in_4bit false"
        )


def check_rollout_servers(config: GRPOConfig) -> None:
    if config.rollout_servers and config.rollout_engine != "vllm":
        raise ConfigError(
            f"rollout_engine={config.rollout_engine!r} with rollout_servers: servers are vLLM; "
            "drop rollout_servers to roll out in process, or set rollout_engine 'vllm'"
        )
    if config.rollout_servers and config.sft_steps:
        raise ConfigError(
            "rollout_servers with sft_steps > 0: the servers serve `model`, not the warm "
            "start's output; start the servers on a model folder that has it (a run's sft/ "
            "folder) and train with model set to that folder and sft_steps 0"
        )
    if config.rollout_router_url and not config.rollout_servers:
        raise ConfigError(
            "rollout_router_url needs rollout_servers too: adapters are published to each "
            "server directly (routers forward requests, not adapter loads)"
        )
    for name, unset in SERVER_ONLY.items():
        value = getattr(config, name)
        if value != unset and not config.rollout_servers:
            raise ConfigError(
                f"{name}={value!r} applies only with rollout_servers (in-process rollouts "
                f"never read it); set rollout_servers, or drop {name}"
            )
    _refuse_url_credentials(config)
    bad = [url for url in config.rollout_servers if not _is_http_url(url)]
    if bad:
        raise ConfigError(
            f"rollout_servers={config.rollout_servers!r}: {bad[0]!r} is not an http(s) URL; "
            "write each server as e.g. 'http://gpu-a:8000'"
        )
    if config.rollout_router_url is not None and not _is_http_url(config.rollout_router_url):
        raise ConfigError(
            f"rollout_router_url={config.rollout_router_url!r} is not an http(s) URL; write "
            "it as e.g. 'http://router:30000'"
        )



#: Step-count knobs that must be >= 1, and what null means for the ones that may be null.
_STEP_KNOBS: dict[str, str | None] = {
    "max_steps": None,
    "logging_steps": None,
    "eval_steps": "no periodic eval (step 0 and the final one still run)",
    "save_steps": "a checkpoint at the last step only",
    "save_total_limit": "keep every checkpoint",
}

def check_schedule(config: GRPOConfig) -> None:
    for name, off in _STEP_KNOBS.items():  # first: the warm-up rule reads max_steps
        value = getattr(config, name)
        if value is not None and value < 1:
            null = f", or null: {off}" if off else ""
            raise ConfigError(f"{name}={value!r} must be >= 1{null}")
    if config.warmup_steps and config.lr_scheduler_type == "constant":
        raise ConfigError(
            f"warmup_steps={config.warmup_steps!r} with lr_scheduler_type='constant', which "
            "has no warm-up; use 'constant_with_warmup' (or 'linear', 'cosine')"
        )
    if config.warmup_step_count > config.max_steps:
        raise ConfigError(
            f"warmup_steps={config.warmup_steps!r} is longer than the run's max_steps="
            f"{config.max_steps}; shorten the warm-up or train longer"
        )
    if config.gradient_accumulation_steps < 1 or \
            config.gradient_accumulation_steps > config.episodes_per_step:
        raise ConfigError(
            f"gradient_accumulation_steps={config.gradient_accumulation_steps!r} must be "
            f"between 1 and the {config.episodes_per_step} episodes per step"
        )
    unknown = [r for r in config.report_to if r not in REPORT_TO]
    if unknown or (len(config.report_to) > 1 and {"auto", "none"} & set(config.report_to)):
        raise ConfigError(
            f"report_to={config.report_to!r}: use 'auto', 'none', or a list of {REPORT_TO[2:]}"
        )
    twice = [r for i, r in enumerate(config.report_to) if r in config.report_to[:i]]
    if twice:
        raise ConfigError(
            f"report_to={config.report_to!r} names {twice[0]!r} twice; list each tracker once"
        )


def check_output_dir(config: GRPOConfig) -> None:
    if not config.output_dir.strip():
        raise ConfigError(
            f"output_dir={config.output_dir!r} is empty, which would write the run into the "
            "current folder; name a run folder, e.g. 'runs/grpo'"
        )


def warn_is_bias(config: GRPOConfig) -> None:
    truncated = config.top_p < 1 or config.top_k > 0 or bool(config.min_p)
    if truncated and config.vllm_importance_sampling_correction:
        warnings.warn(
            "top_p/top_k/min_p truncate the sampling distribution; the trainer scores the "
            "full one, so importance-sampling weights are biased (TRL #6789)",
            UserWarning,
            stacklevel=5,  # the code that built the config (through its __init__ wrapper)
        )


def warn_full_weight_rate(config: GRPOConfig) -> None:
    """LoRA at a full fine-tuning rate barely moves: the "LoRA doesn't learn" reports."""
    if 0 < config.learning_rate < LOWEST_LORA_RATE:
        warnings.warn(
            f"learning_rate={config.learning_rate!r} is a full-weight rate (TRL's default is "
            "1e-6); LoRA needs about 10x that and barely learns here (TRL #2872): try 1e-5",
            UserWarning,
            stacklevel=5,  # the code that built the config (through its __init__ wrapper)
        )


def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the type ``hint`` (the subset of types GRPOConfig uses)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _is_share(value: Any) -> bool:
    """A finite positive number that is not a bool (``true`` is an int to Python)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


def _refuse_url_credentials(config: GRPOConfig) -> None:
    """Refuse a rollout URL with a user:password (or a ?query, #fragment), echoing none.

    Why: the worker refused it only when the job ran (the `VLLMFleet` check), while the job
    API had stored it in the run database and showed it to every client; and the refusals
    below echo every URL. `check_url_root_alone` is the check `--server` and ``--base-url``
    get: one rule, one wording.
    """
    from agentgym._policies import check_url_root_alone

    hint = "train sends its servers no key: serve them on a trusted network"
    for url in config.rollout_servers:
        check_url_root_alone(url, "rollout_servers", "http://gpu-a:8000", hint)
    if config.rollout_router_url is not None:
        check_url_root_alone(config.rollout_router_url, "rollout_router_url",
                             "http://router:30000", hint)  # fmt: skip


def _is_http_url(url: str) -> bool:
    """``http(s)://host...``: what `VLLMFleet` and the router client can send requests to."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _describe(hint: Any) -> str:
    """A short human name for a type hint, for error messages."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "value, one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", str(hint))


#: Every rule, in the order `GRPOConfig.__post_init__` runs them.
CONFIG_RULES: tuple[Callable[[GRPOConfig], None], ...] = (
    check_types, check_finite, check_ranges, check_loss, check_env_kwargs, check_tasks,
    check_lora,
    check_hardware, check_rollout_servers, check_schedule, check_output_dir,
    warn_is_bias, warn_full_weight_rate,
)  # fmt: skip
