"""`agentgym train CONFIG --dry-run`: what a run would do, checked, without doing it.

An hour on a GPU should not start from a config that trains on the wrong tasks, evaluates too
rarely, or that its run folder refuses once the model has loaded. A dry run makes the checks a
run makes before it loads weights (`GRPOConfig`'s rules, `preflight`, the run folder's
refusals, in that order) and describes the run they resolved. It starts no engine, loads no
weights and writes nothing but the ``tiny`` model's cache, which the run would build too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentgym._check import HUNG_FIX, PLAY_SECONDS, Hung, load_tokenizer, reference_conversation
from agentgym._errors import ConfigError
from agentgym._registry import resolve_id
from agentgym._types import Message
from agentgym.engine import ChatRenderer
from agentgym.engine._episode import choose_mode
from agentgym.runs._folder import SFT_SUMMARY, sft_checkpoint

from ._config import GRPOConfig
from ._distributed import World
from ._memory import CpuEstimate, parameter_count
from ._preflight import Checked, gpu_split, preflight, resolved_device
from ._run_dir import WARM_START, RunDir, checkpoints_by_step
from ._tracking import resolve_report_to


def dry_run(config: GRPOConfig, *, resume: bool = False) -> list[tuple[str, str]]:
    """Check ``config`` as ``agentgym train`` would; returns the run's plan as (what, how) rows.

    Raises:
        ConfigError: whatever the run would refuse before its model loads, with the fix.
    """
    world = World.from_env()  # under torchrun: the run's own refusal of an unequal split
    world.check_divides("tasks_per_step", config.tasks_per_step)
    checked = preflight(config)
    folder = _run_folder(config, resume, checked.tasks_sha256)
    episodes = config.episodes_per_step
    processes = [("processes", f"{world.world_size} (torchrun), "
                  f"{config.tasks_per_step // world.world_size} tasks a step each; rank 0 "
                  "writes the run folder")] if world.world_size > 1 else []  # fmt: skip
    return processes + [
        ("model", _model(config, checked)),
        ("env", _env(config, checked)),
        ("tasks", f"{len(checked.train_tasks):,} to train on, {len(checked.eval_tasks):,} "
                  "held out for eval"),  # fmt: skip
        ("each step", f"{config.tasks_per_step} tasks x {config.num_generations} generations = "
                      f"{episodes} episodes, up to {config.max_completion_length} tokens a "
                      f"turn, rolled out on {_engine(config)}"),  # fmt: skip
        ("training", _training(config, episodes)),
        ("rollouts", _rollout_mode(config, checked)),
        ("loss", _loss(config)),
        ("evaluation", _evaluation(config, len(checked.eval_tasks))),
        ("checkpoints", _checkpoints(config)),
        ("trackers", ", ".join(resolve_report_to(config.report_to)) or "none (metrics.jsonl)"),
        ("run folder", folder),
    ]


def _model(config: GRPOConfig, checked: Checked) -> str:
    targets = config.lora_target_modules
    where = targets if isinstance(targets, str) else ", ".join(targets)
    device = resolved_device(config)
    shown = device if config.device != "auto" else f"auto ({device} here)"
    text = (f"{config.model} ({checked.model_dir}), LoRA r{config.lora_r} alpha "
            f"{config.lora_alpha:g} on {where}, device {shown}, dtype {config.dtype}")  # fmt: skip
    if config.load_in_4bit:
        text += ", 4-bit base (QLoRA)"
    if device == "cpu":
        cpu = CpuEstimate.of(checked.model_dir, config, World.from_env().world_size)
        text += (f"; ~{cpu.params / 1e6:,.1f} M parameters, ~{_size(cpu.need)} of this "
                 f"machine's {_size(cpu.have)} to train on the CPU (peak in {cpu.peak})")
    else:
        params = parameter_count(checked.model_dir)
        text += f"; ~{params / 1e6:,.1f} M parameters, {gpu_split(config, params).describe()}"
    return text


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def _env(config: GRPOConfig, checked: Checked) -> str:
    names = [schema.get("function", {}).get("name", "?") for schema in checked.tools]
    tools = ", ".join(names) if names else "no tools"
    return f"{resolve_id(config.env)}: {tools}; up to {checked.env_max_turns} turns an episode"


def _engine(config: GRPOConfig) -> str:
    if config.rollout_servers:
        return f"{len(config.rollout_servers)} vLLM server(s)"
    engine = "in-process vLLM" if config.rollout_engine == "vllm" else "transformers"
    if config.max_staleness:
        engine += f", while the update runs (max_staleness {config.max_staleness})"
    return engine


def _rollout_mode(config: GRPOConfig, checked: Checked) -> str:
    """``concat`` or ``per_turn`` and why, decided as the run's engine will decide it.

    Why: a template that rewrites history (Qwen3's) trains every turn as its own sample, at
    O(turns^2) tokens; a user should read that before the run, and a ``rollout_mode: concat``
    the template cannot do is refused here, not after the model and engine loaded.
    """
    tokenizer = load_tokenizer(str(checked.model_dir))
    kwargs = config.chat_template_kwargs
    example = reference_example(config, tokenizer)
    renderer = ChatRenderer(tokenizer, kwargs)
    decision = choose_mode(renderer, config.rollout_mode, checked.tools, example or ())
    return f"{decision.mode} mode: {decision.reason}"


def reference_example(config: GRPOConfig, tokenizer: object) -> list[Message] | None:
    """The env's reference conversation the mode is decided on (`reference_conversation`).

    Bounded by ``episode_deadline_s`` (`PLAY_SECONDS` where it is None). Why: a reward
    function or tool that never returned hung the run, and its dry run, before step 1 with
    no deadline and no word of why; a ConfigError now names the function.
    """
    seconds = PLAY_SECONDS if config.episode_deadline_s is None else config.episode_deadline_s
    try:
        return reference_conversation(
            config.env, config.run_env_kwargs, tokenizer, config.chat_template_kwargs, seconds
        )
    except Hung as hung:
        raise ConfigError(
            f"the env's reference episode (played to decide the rollout mode) did not finish "
            f"in {seconds:g} s: {hung.where} never returned; {HUNG_FIX}, or raise "
            "episode_deadline_s if it is only slow"
        ) from None


def _training(config: GRPOConfig, episodes: int) -> str:
    schedule: str = config.lr_scheduler_type
    if config.warmup_step_count:  # a 'constant' schedule with one was refused
        schedule += f" after {config.warmup_step_count:,} warm-up steps from 0"
    grpo = (f"{config.max_steps:,} GRPO steps ({config.max_steps * episodes:,} episodes), "
            f"learning rate {config.learning_rate:g} ({schedule})")  # fmt: skip
    if not config.sft_steps:
        return grpo
    shares, total = config.sft_scripts, sum(config.sft_scripts.values())
    scripts = " + ".join(f"{share / total:.0%} {name}" for name, share in shares.items())
    what = "full-weight" if config.sft_method == "full" else f"LoRA r{config.lora_r} (merged)"
    return f"{config.sft_steps:,} {what} SFT warm-start steps on {scripts} traces, then {grpo}"


#: The knobs that shape the loss, shown by `_loss` where they differ from their defaults.
_LOSS_KNOBS = (
    "importance_sampling_level", "epsilon", "epsilon_high", "delta", "beta",
    "use_bias_correction_kl", "scale_rewards", "multi_objective_aggregation", "num_iterations",
    "mask_truncated_completions", "top_entropy_quantile", "off_policy_mask_threshold",
    "entropy_coef", "use_adaptive_entropy",
    "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target",
    "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos",
    "vespo_k_neg", "vespo_lambda_neg", "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
)  # fmt: skip


def _loss(config: GRPOConfig) -> str:
    """The loss type and the loss knobs set away from their defaults (to check a TRL config)."""
    defaults = GRPOConfig.defaults()
    changed = [f"{k} {getattr(config, k)}" for k in _LOSS_KNOBS
               if getattr(config, k) != defaults[k]]  # fmt: skip
    return f"{config.loss_type}; " + (", ".join(changed) or "every other loss knob at its default")


def _evaluation(config: GRPOConfig, eval_count: int) -> str:
    before = "on the base model, after the warm start" if config.sft_steps else "before training"
    text = f"all {eval_count:,} held-out tasks {before} and after step {config.max_steps}"
    periodic = _every(config.eval_steps, config.max_steps)
    if periodic:
        played = min(config.eval_num_tasks or eval_count, eval_count)
        text += f"; the first {played:,} {_at(periodic)}"
    return text


def _checkpoints(config: GRPOConfig) -> str:
    kept = "all kept" if config.save_total_limit is None else (
        f"the newest {config.save_total_limit} kept")  # fmt: skip
    return f"{_at(_every(config.save_steps, config.max_steps), then=config.max_steps)}; {kept}"


def _run_folder(config: GRPOConfig, resume: bool, tasks_sha256: str | None) -> str:
    """What opening ``output_dir`` would do, making the refusals the run would make."""
    path, defaults = config.output_dir, GRPOConfig.defaults()
    if resume and RunDir.finished_figures(path, config.max_steps, config.to_dict(), defaults):
        return (f"{path}: finished (max_steps {config.max_steps} reached); a resume only "
                "reports its figures")  # fmt: skip
    previous = RunDir.check_open(path, config.to_dict(), resume=resume, defaults=defaults,
                                 tasks_sha256=tasks_sha256)  # fmt: skip
    if previous is None:
        return f"{path}: a new run"
    done = checkpoints_by_step(path)
    if not done:
        return f"{path}: holds a run with no GRPO checkpoint; {_warm_start_kept(config)}"
    return f"{path}: resumes after step {max(done)} of {config.max_steps}"


def _warm_start_kept(config: GRPOConfig) -> str:
    """What a resume keeps of a run stopped before its first GRPO checkpoint.

    Why: a run killed during its SFT warm start was said to "start over", and the user
    deleted a folder whose warm start was done, or half done, and would have been reused.
    """
    warm_start = Path(config.output_dir) / WARM_START
    if config.sft_steps and (warm_start / SFT_SUMMARY).is_file():
        return "its SFT warm start is kept and GRPO starts at step 1"
    if config.sft_steps and sft_checkpoint(warm_start).is_file():
        return "its SFT warm start resumes from its checkpoint, then GRPO starts at step 1"
    return "it would start over"


def _every(interval: int | None, end: int) -> range:
    """Every ``interval``-th step before ``end``, as a range: never listed whole.

    Why: listing them ran a dry run of ``max_steps: 1000000000000`` out of memory.
    """
    return range(interval, end, interval) if interval else range(0)


def _at(steps: range, then: int | None = None) -> str:
    """``at step 3`` or ``at steps 25, 50, 75``: ``steps``, then the step ``then``."""
    last = [then] if then is not None else []
    count = len(steps) + len(last)
    return f"at step {[*steps, *last][0]}" if count == 1 else f"at steps {_steps(steps, last)}"


def _steps(steps: range, last: Sequence[int]) -> str:
    """``25, 50, 75`` or, for many, ``10, 20, ..., 1000 (100 times)``; reads ``steps`` lazily."""
    count = len(steps) + len(last)
    if count <= 6:
        return ", ".join(map(str, [*steps, *last]))
    return f"{steps[0]}, {steps[1]}, ..., {[*steps[-1:], *last][-1]} ({count:,} times)"
