"""Trainer benchmarks on the tiny model, side by side in one run.

(b) Weight sync after an optimiser step, on the same LoRA weights:

- adapter-only (ours): save the PEFT adapter (``RunDir.save_adapter``: written aside, then
  renamed into place) and `VLLMPolicy.load_adapter` it as a new version into the running
  engine.
- merge-and-reload (TRL's way: GRPOTrainer merges the LoRA into the base weights, pushes every
  base parameter into its vLLM engine, unmerges, resets the prefix cache): PEFT
  ``merge_adapter``, the merged base weights written as one safetensors file,
  ``unmerge_adapter``; then vLLM 0.32's in-place ``reload_weights`` of that file into the same
  running engine (``AsyncLLM.collective_rpc``) and ``reset_prefix_cache``. The engine core
  is another process, and ``collective_rpc`` cannot carry tensors (vLLM's ``ipc`` weight
  transfer is CUDA IPC), so the weights cross as a file, timed in two places: ``shm``
  (/dev/shm, memory-backed: the in-memory transport on CPU) and ``disk``. The ratio uses the
  faster. ``--restart`` also times a fresh engine on a merged model folder (the worst case).
  A greedy sample from the merged weights is compared with one from the adapter, to show
  both paths serve the same weights.

(a) Seconds per GRPO step, ours vs TRL's GRPOTrainer with its own tool loop, on the same
  workload (`WORKLOAD`): `bench_step_time`, both trainers timed in this process. ``--engine
  hf`` rolls ours out with transformers (`HFPolicy`) and keeps TRL on transformers too: the
  comparison for a machine without vLLM (the GPU image of the device machine has none).
  Our env answers a malformed tool call with the error and another turn, where TRL's loop
  takes that turn as the answer; ``--malformed-ends-episode`` makes ours end there too, so
  both play the same episodes (`ToolEnv`'s ``malformed_call_ends_episode``).
  ``--compare-compiled`` also times ours with its vLLM engine compiled
  (``GRPOConfig.rollout_compile``), ``--compare-overlap`` with the next step's rollouts
  running during this step's update (``GRPOConfig.max_staleness=1``), in the same run.
  TRL's ``max_completion_length`` bounds a whole completion (every turn and tool result
  together): a tool result that would pass it is dropped and the episode ends with no answer
  turn, where ours bounds each turn. The bench prints how many tool results TRL kept;
  ``--trl-completion-length N`` gives TRL room for its tool turns (ours unchanged).

    python bench/trainer_bench.py [--trials 5] [--lora-r 16] [--restart] [--skip-step]
        [--shape tiny|quickstart|qwen2.5-0.5b | --model-dir DIR] [--warm-start STEPS]
        [--skip-sync] [--engine vllm|hf] [--device auto|cpu|cuda] [--malformed-ends-episode]
        [--compare-compiled] [--compare-overlap] [--trl-completion-length N] [--steps 4]
        [--repeats 1]

Each sync trial runs every path on the same weights back to back, in turn first and last
(the machine's drift hits all alike), and each path's time includes what serving the first
token from the new weights costs beyond a forward pass (vLLM copies a loaded adapter into the
model on first use); the medians of the trials are compared. Step times (a) are wall time
between the ends of consecutive steps on every side, the first (warm-up) and last step dropped;
``--repeats R`` runs the sides R times in alternating order and pools their steps.

The random tiny model never calls the tool, so TRL's tool loop idles in (a); give a model
that does (``--warm-start STEPS``: SFT on oracle traces with the workload's system prompt,
stopped as the quickstart's warm start is, at most STEPS; or ``--model-dir``) to time
tool turns: the bench prints the tool calls per episode on both sides. On a shared 2-core
machine the timings move with its load: compare numbers from one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.engine import VLLMPolicy
from agentgym.engine.tiny import PRESETS, build_tiny_model, random_lora_model
from agentgym.trainers._run_dir import RunDir

#: Model shapes for `--shape`: the tiny test model, the quickstart's, and a Qwen2.5-0.5B-shaped
#: one (same layers, widths and heads; randomly initialised, and with the byte vocabulary, so
#: its embedding is ~0.2M parameters instead of Qwen's 136M: merge-and-reload moves less here).
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "quickstart": PRESETS["quickstart"],
    "qwen2.5-0.5b": {
        "hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2,
        "intermediate_size": 4864, "max_position_embeddings": 2048,
    },
}  # fmt: skip


@dataclass(frozen=True)
class Workload:
    """The GRPO step both trainers run in (a)."""

    env: str = "calculator"
    tasks_per_step: int = 2
    num_generations: int = 4
    max_completion_length: int = 48  # ours: per turn; TRL: the whole completion, unless:
    trl_max_completion_length: int | None = None  # TRL's whole-completion budget (None: above)
    max_turns: int = 4
    lora_r: int = 16
    learning_rate: float = 1e-4
    steps: int = 4  # timed steps; a warm-up step before them and a last one after, both dropped
    system_prompt: str | None = None  # None: the calculator env's own
    malformed_call_ends_episode: bool = False  # True: our episodes end on one, as TRL's do
    engine: str = "vllm"  # our rollout engine: "vllm" or "hf" (then TRL generates with HF too)
    rollout_compile: bool = False  # GRPOConfig.rollout_compile: the vLLM engine compiled
    max_staleness: int = 0  # GRPOConfig.max_staleness: 1 rolls out the next step while training
    device: str = "auto"  # where both trainers train: "auto" is CUDA when there is one

    @property
    def env_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"num_tasks": 64}
        if self.malformed_call_ends_episode:
            kwargs["malformed_call_ends_episode"] = True
        if self.system_prompt is not None:
            kwargs["system_prompt"] = self.system_prompt
        return kwargs

    @property
    def episodes(self) -> int:
        return self.tasks_per_step * self.num_generations


WORKLOAD = Workload()


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    """(seconds, result) of ``fn(*args, **kwargs)``."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


# ---- (b) sync -------------------------------------------------------------------------------


def _nudge(model: Any) -> None:
    """Stand-in for an optimiser step: every LoRA weight moves a little."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 1e-3)


@contextlib.contextmanager
def merged_weights(model: Any) -> Iterator[dict[str, Any]]:
    """The base weights with the LoRA merged in, named as the base checkpoint (TRL's recipe).

    Valid inside the block only (no copy is made: the caller saves or sends them there);
    the LoRA is unmerged on exit.
    """
    model.merge_adapter()
    try:
        base = model.get_base_model()
        tied = bool(getattr(base.config, "tie_word_embeddings", False))
        yield {
            k.replace(".base_layer.", "."): v.detach()
            for k, v in base.state_dict().items()
            if "lora_" not in k and not (tied and k == "lm_head.weight")
        }
    finally:
        model.unmerge_adapter()


def _save_merged(model: Any, file: Path) -> None:
    from safetensors.torch import save_file

    with merged_weights(model) as state:
        save_file(state, str(file))


def _tmpfs() -> str | None:
    """/dev/shm where it exists (memory-backed files: the in-memory transport on CPU)."""
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def _engine_call(policy: VLLMPolicy, coro_fn: Callable[[Any], Any]) -> Any:
    """Run ``coro_fn(engine)`` on the policy's engine loop (bench-only use of internals)."""
    thread, _ = policy._started()
    return thread.submit(coro_fn(policy._engine)).result()


def _reload(policy: VLLMPolicy, **kwargs: Any) -> None:
    async def go(engine: Any) -> None:
        await engine.collective_rpc("reload_weights", kwargs=kwargs)
        await engine.reset_prefix_cache()

    _engine_call(policy, go)


def _greedy(
    policy: VLLMPolicy, prompt_ids: list[int], version: int, max_tokens: int = 24
) -> list[int]:
    """Greedy ids from adapter ``version`` (0: the engine's base weights)."""
    current = policy.adapter_version
    policy.adapter_version = version
    try:
        completion = asyncio.run(policy.generate_ids(prompt_ids, max_tokens=max_tokens))
    finally:
        policy.adapter_version = current
    return list(completion.completion_ids or [])


def _sync_adapter(
    run: RunDir, model: Any, policy: VLLMPolicy, prompt: list[int]
) -> dict[str, float]:
    """Ours: save the adapter, load it as a new version, and its activation (`_activation`)."""
    version = policy.adapter_version + 1
    save_s, path = _timed(run.save_adapter, model, version)
    load_s, _ = _timed(policy.load_adapter, path)
    activate_s = _activation(policy, prompt, version)
    return {"adapter: save": save_s, "adapter: load": load_s, "adapter: activation": activate_s,
            "adapter: total": save_s + load_s + activate_s}


def _activation(policy: VLLMPolicy, prompt: list[int], version: int) -> float:
    """What the first one-token request on new weights costs more than the next, the same one.

    Why: vLLM's ``add_lora`` only registers an adapter; it is copied into the model's LoRA
    slots (and fused on agentgym's CPU path) on the first request that uses it, so a sync
    timed to the end of the load left that out. The second request's own forward pass (equal
    on every path) is subtracted; both start from an empty prefix cache for the new weights.
    """
    first_s, _ = _timed(_greedy, policy, prompt, version, 1)
    _engine_call(policy, lambda engine: engine.reset_prefix_cache())
    again_s, _ = _timed(_greedy, policy, prompt, version, 1)
    return max(0.0, first_s - again_s)


def _sync_merged(
    transport: str, folder: Path, model: Any, policy: VLLMPolicy, prompt: list[int]
) -> dict[str, float]:
    """TRL's way: merge and save the base weights, reload them, and their `_activation`."""
    folder.mkdir(exist_ok=True)
    save_s, _ = _timed(_save_merged, model, folder / "model.safetensors")
    reload_s, _ = _timed(_reload, policy, weights_path=str(folder))
    activate_s = _activation(policy, prompt, 0)
    return {f"{transport}: merge+save": save_s, f"{transport}: reload": reload_s,
            f"{transport}: activation": activate_s,
            f"{transport} total": save_s + reload_s + activate_s}


def bench_sync(model_dir: Path, trials: int, lora_r: int, restart: bool) -> dict[str, float]:
    """Median seconds of each sync path on the same weights; prints a table."""
    model = random_lora_model(model_dir, rank=lora_r, alpha=2 * lora_r)  # as after training
    work = Path(tempfile.mkdtemp(prefix="trainer-bench-"))
    run = RunDir(work / "run", {"bench": "sync"})
    shm = Path(tempfile.mkdtemp(prefix="trainer-bench-", dir=_tmpfs()))
    times: dict[str, list[float]] = {}
    with VLLMPolicy(model_dir, sampling={"temperature": 0.0, "max_tokens": 24}, dtype="float32",
                    max_model_len=1024, enable_lora=True, max_lora_rank=lora_r) as policy:
        prompt = policy.renderer.tokenizer.encode("What is 12 + 30?")
        paths: list[Callable[[], dict[str, float]]] = [
            lambda: _sync_adapter(run, model, policy, prompt),
            lambda: _sync_merged("shm", shm, model, policy, prompt),
            lambda: _sync_merged("disk", work / "merged", model, policy, prompt),
        ]
        for trial in range(trials + 1):  # the first trial warms up, and is dropped
            _nudge(model)  # then each path syncs these weights, side by side in one trial,
            for path in paths[trial % 3 :] + paths[: trial % 3]:  # each first and last in turn
                for key, value in path().items():
                    times.setdefault(key, []).append(value)
        merged_ids = _greedy(policy, prompt, 0)  # the engine's base weights: the last merge
        _reload(policy, weights_path=str(model_dir))  # the original base under the adapter
        adapter_ids = _greedy(policy, prompt, policy.adapter_version)
    if restart:
        times["restart total"] = [_restart_seconds(model_dir, model, work)]
    shutil.rmtree(shm, ignore_errors=True)
    medians = {k: _median(v[1:] if len(v) > 1 else v) for k, v in times.items() if v}
    _print_sync(medians, adapter_ids, merged_ids, lora_r, model)
    run.mark_finished()
    return medians


def _restart_seconds(model_dir: Path, model: Any, work: Path) -> float:
    """Merge, save a full model folder, start a fresh engine on it: the worst case."""
    started = time.perf_counter()
    merged = work / "merged-model"
    shutil.copytree(model_dir, merged, dirs_exist_ok=True)
    _save_merged(model, merged / "model.safetensors")
    with VLLMPolicy(merged, dtype="float32", max_model_len=1024) as policy:
        policy.start()
    return time.perf_counter() - started


def _print_sync(
    medians: dict[str, float], adapter_ids: list[int], merged_ids: list[int], lora_r: int,
    model: Any,
) -> None:  # fmt: skip
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    base = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    print(f"\n(b) weight sync, median of the timed trials (LoRA r={lora_r}: {lora:,} adapter "
          f"parameters vs {base:,} base parameters)")  # fmt: skip
    for key, value in medians.items():
        print(f"  {key:<24} {value * 1000:9.1f} ms")
    ours = medians["adapter: total"]
    path = min(("shm", "disk"), key=lambda t: medians[f"{t} total"])
    merge = medians[f"{path} total"]
    agree = sum(a == b for a, b in zip(adapter_ids, merged_ids))
    print(f"  greedy tokens, adapter vs merged weights: {agree}/{max(len(adapter_ids), 1)} agree")
    print(f"  adapter-only sync {ours * 1000:.1f} ms vs merge-and-reload ({path}) "
          f"{merge * 1000:.1f} ms, each with its activation on the first request: "
          f"{merge / ours:.1f}x faster (goal >= 10x)")  # fmt: skip


# ---- (a) step time --------------------------------------------------------------------------


def bench_step_time(
    model_dir: Path,
    workload: Workload = WORKLOAD,
    compare_compiled: bool = False,
    compare_overlap: bool = False,
    repeats: int = 1,
) -> dict[str, float]:
    """Seconds per GRPO step: ours vs TRL's GRPOTrainer with its own tool loop.

    Both run `workload` on the same tiny model: same tasks per step, generations, completion
    length, turns, LoRA rank and learning rate. ``compare_compiled`` also times ours with a
    compiled vLLM engine (``rollout_compile=True``), ``compare_overlap`` with the next step
    rolling out while this one trains (``max_staleness=1``), in the same run. ``repeats``
    runs every side that many times, the order reversed each time, and pools their steps.
    """
    sides: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("trl", functools.partial(trl_seconds_per_step, model_dir, workload)),
        ("ours", functools.partial(our_seconds_per_step, model_dir, workload)),
    ]
    variants: dict[str, tuple[str, Workload]] = {}  # name: (label, workload)
    if workload.engine == "vllm" and compare_compiled:
        variants["compiled"] = ("rollout_compile=True (vLLM compiled)",
                                dataclasses.replace(workload, rollout_compile=True))  # fmt: skip
    if compare_overlap:
        variants["overlap"] = ("max_staleness=1 (the next step rolls out during the update)",
                               dataclasses.replace(workload, max_staleness=1))  # fmt: skip
    for name, (_, changed) in variants.items():
        sides.append((name, functools.partial(our_seconds_per_step, model_dir, changed)))
    pooled: dict[str, dict[str, Any]] = {name: {} for name, _ in sides}
    for repeat in range(repeats):
        for name, run in sides[::-1] if repeat % 2 else sides:
            for key, value in _peak_memory(run).items():
                _pool(pooled[name], key, value)
    trl, ours = (_medians(pooled[name]) for name in ("trl", "ours"))
    print(f"\n(a) seconds per GRPO step ({workload.episodes} episodes of {workload.env}, "
          f"median of {workload.steps} steps x {repeats} repeats: wall time between step "
          f"ends, first and last step dropped, on {_device(workload)})")  # fmt: skip
    print(f"  TRL GRPOTrainer (tools=[calculate], {trl['generation']}): {trl['seconds']:.2f} s "
          f"(tool calls per completion {trl['tool_calls']:.2f}, tool results kept "
          f"{trl['tool_results']:.2f}: a result that would pass its max_completion_length "
          f"{trl['budget']} is dropped, and no answer turn follows)")  # fmt: skip
    print(f"  agentgym GRPOTrainer (rollout_engine {workload.engine}): {_phases(ours)} "
          f"(tool calls per episode {ours['tool_calls']:.2f}, turns per episode "
          f"{ours['turns']:.2f}: {_MALFORMED[workload.malformed_call_ends_episode]})  ->  "
          f"{ours['seconds'] / trl['seconds']:.2f}x TRL's (goal <= 1.0x)")  # fmt: skip
    for name, (label, _) in variants.items():
        other = _medians(pooled[name])
        print(f"  agentgym, {label}: {_phases(other)}  ->  "
              f"{other['seconds'] / trl['seconds']:.2f}x TRL's, "
              f"{other['seconds'] / ours['seconds']:.2f}x ours above")  # fmt: skip
    if "peak_gib" in ours:
        print(f"  peak GPU memory: TRL {trl['peak_gib']:.1f} GiB, ours {ours['peak_gib']:.1f} GiB "
              "(ours: trainer and rollout engine each hold the weights)")  # fmt: skip
    return {"trl": trl["seconds"], "ours": ours["seconds"]}


def _pool(into: dict[str, Any], key: str, value: Any) -> None:
    """Lists (per-step figures) add up across repeats; a peak keeps the largest; others stay."""
    if isinstance(value, list):
        into.setdefault(key, []).extend(value)
    elif key == "peak_gib":
        into[key] = max(value, into.get(key, 0.0))
    else:
        into[key] = value


def _medians(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: _median(v) if isinstance(v, list) else v for k, v in figures.items()}


def _between_step_ends(ends: list[float]) -> list[float]:
    """Step times as the wall time between consecutive step ends, both sides alike.

    The first step (no end before it: the warm-up) and the last are dropped: with
    ``max_staleness`` 1 the last step has no rollout to overlap, and on every side it is
    followed by the end of training rather than by another step.
    """
    return [b - a for a, b in zip(ends, ends[1:])][:-1]


def _phases(figures: dict[str, float]) -> str:
    """A step's wall time and what it spent it on (rollouts may overlap the update)."""
    return (f"{figures['seconds']:.2f} s a step: rollouts {figures['rollout']:.2f} s (waited "
            f"for {figures['rollout_wait']:.2f}), update {figures['train']:.2f}, sync "
            f"{figures['sync']:.3f}")  # fmt: skip


def _peak_memory(trainer: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``trainer()``'s figures, with its peak CUDA memory (GiB) where it ran on CUDA."""
    import torch

    if not torch.cuda.is_available():
        return trainer()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    figures = trainer()
    return {**figures, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def our_seconds_per_step(model_dir: Path, workload: Workload) -> dict[str, Any]:
    """agentgym's `GRPOTrainer` on ``workload``: the seconds of each timed step, and its phases.

    A step is rollouts (vLLM, token-exact) + loss and optimiser step + adapter sync + the
    step's metrics and logging: the wall time between the ``time`` stamps of consecutive rows
    of the run's ``metrics.jsonl`` (each written as its step ends), as TRL's side is timed;
    with ``max_staleness`` 1 the next step's rollouts run during the update. The phases come
    from the rows' ``time/*`` figures; with the tool calls and turns per episode.
    """
    from agentgym.trainers import GRPOConfig, GRPOTrainer

    out = Path(tempfile.mkdtemp(prefix="agentgym-bench-")) / "run"
    config = GRPOConfig(
        model=str(model_dir), env=workload.env, env_kwargs=workload.env_kwargs,
        train_tasks="8:64", eval_tasks="0:8", eval_num_tasks=1,
        tasks_per_step=workload.tasks_per_step, num_generations=workload.num_generations,
        max_completion_length=workload.max_completion_length, max_turns=workload.max_turns,
        lora_r=workload.lora_r, lora_alpha=2 * workload.lora_r,
        learning_rate=workload.learning_rate, max_steps=workload.steps + 2, sft_steps=0,
        eval_steps=None, save_steps=None, report_to=["none"], device=_device(workload),
        rollout_engine=workload.engine, rollout_compile=workload.rollout_compile,
        max_staleness=workload.max_staleness,
        max_model_len=_context(model_dir), output_dir=str(out),
    )  # fmt: skip
    GRPOTrainer(config).train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/rollout" in r]
    steps = rows[1:-1]  # the rows of the steps `_between_step_ends` times
    return {
        "seconds": _between_step_ends([r["time"] for r in rows]),
        **{stage: [r[f"time/{stage}"] for r in steps] for stage in _STAGES},
        "tool_calls": [r["rollout/tool_calls_per_episode"] for r in steps],
        "turns": [r["rollout/turns_per_episode"] for r in steps],
    }


_STAGES = ("rollout", "rollout_wait", "train", "sync")
#: What our env does with a malformed call, by ``Workload.malformed_call_ends_episode``.
_MALFORMED = {
    False: "a malformed call gets an error message and another turn",
    True: "a malformed call ends the episode, as in TRL's loop",
}


def _device(workload: Workload) -> str:
    import torch

    if workload.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return workload.device


def _context(model_dir: Path) -> int:
    """The model's context, at most 2048 tokens (the quickstart's model has 1024)."""
    config = json.loads((model_dir / "config.json").read_text())
    return min(2048, int(config.get("max_position_embeddings", 2048)))


def trl_seconds_per_step(model_dir: Path, workload: Workload) -> dict[str, Any]:
    """TRL 1.16 GRPOTrainer, LoRA, ``tools=[calculate]``: the seconds of each timed step.

    TRL's tool loop runs batch-synchronously: generate for every prompt, run the tool calls
    it parsed, generate again for those, up to ``max_tool_calling_iterations``. Generation is
    transformers' ``generate`` (``use_vllm=False``): TRL's vLLM modes need CUDA or a
    ``trl vllm-serve`` server; on CUDA with our engine on vLLM, ``use_vllm=True`` (colocate)
    is used. On CUDA both trainers hold the weights in bfloat16.
    """
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import _SUPPORTS_RESPONSE_TEMPLATE, qwen3_schema, qwen3_template

    from agentgym.envs.calculator import CalculatorEnv, calculate, correct_answer

    env = CalculatorEnv(**workload.env_kwargs)
    tasks = env.tasks
    system = env.system_prompt
    dataset = Dataset.from_list([
        {"prompt": [{"role": "system", "content": system},
                    {"role": "user", "content": t["prompt"]}], "answer": t["answer"]}
        for t in tasks
    ])  # fmt: skip

    kept: list[float] = []  # per step: completions whose tool result TRL kept

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float | None]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        with_result = [isinstance(c, list) and any(m["role"] == "tool" for m in c)
                       for c in completions]  # fmt: skip
        kept.append(sum(with_result) / len(completions))
        return [correct_answer(t or "", a) for t, a in zip(texts, answer)]

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # the tiny template writes hermes tool calls, as Qwen's does: give TRL Qwen's parser
    if _SUPPORTS_RESPONSE_TEMPLATE:
        tokenizer.response_template = qwen3_template
    else:
        tokenizer.response_schema = qwen3_schema
    cuda = _device(workload) == "cuda"
    colocate = cuda and workload.engine == "vllm"
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
        per_device_train_batch_size=workload.episodes,
        num_generations=workload.num_generations,
        max_completion_length=workload.trl_max_completion_length
        or workload.max_completion_length,
        max_tool_calling_iterations=workload.max_turns - 1,
        learning_rate=workload.learning_rate,
        max_steps=workload.steps + 2,
        logging_steps=1, save_strategy="no", report_to="none",
        use_vllm=colocate, vllm_mode="colocate", use_cpu=not cuda, bf16=cuda,
        temperature=1.0, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    dtype = torch.bfloat16 if cuda else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    peft = LoraConfig(r=workload.lora_r, lora_alpha=2 * workload.lora_r,
                      target_modules="all-linear", task_type="CAUSAL_LM")  # fmt: skip
    step_ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            step_ends.append(time.perf_counter())

    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset,
        processing_class=tokenizer, peft_config=peft, tools=[calculate.fn],
        callbacks=[Clock()],
    )  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "tools/call_frequency" in h][1:-1]
    return {"seconds": _between_step_ends(step_ends),
            "tool_calls": [float(h["tools/call_frequency"]) for h in logs],
            "tool_results": kept[1:-1], "budget": args.max_completion_length,
            "generation": "vLLM colocate" if colocate else "transformers generate"}  # fmt: skip


def warm_start(model_dir: Path, steps: int, system_prompt: str | None) -> Path:
    """The model after at most ``steps`` of SFT on oracle calculator traces (tasks 100+), cached.

    The traces carry the workload's ``system_prompt`` (a model prompted otherwise than it was
    trained writes no well-formed call), and the quickstart's warm-start recipe (its config's
    knobs and its trace/validation split) stops training once enough held-back traces come
    out right: the model then calls the tool in nearly every episode, so (a) times tool turns
    on both sides, not one-turn answers.
    """
    from agentgym.engine.tiny import cache_root
    from agentgym.trainers import GRPOConfig
    from agentgym.trainers._sft import SFTConfig, sft_warm_start

    recipe = GRPOConfig.from_yaml(Path(__file__).parents[1] / "examples" / "quickstart.yaml")
    sft = SFTConfig(steps=steps, lr=recipe.sft_learning_rate, batch_size=recipe.sft_batch_size,
                    eval_every=recipe.sft_eval_every, target_accuracy=recipe.sft_target_accuracy)
    traces, validation = recipe.sft_split(list(range(100, 1100)))
    key = json.dumps([system_prompt, dataclasses.asdict(sft), traces, validation])
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    out = cache_root() / "bench" / f"{model_dir.name}-sft{steps}-calls-{digest}"
    if (out / "sft.json").is_file():
        return out
    env_kwargs: dict[str, Any] = {"num_tasks": 1100, "seed": 1234}
    if system_prompt is not None:
        env_kwargs["system_prompt"] = system_prompt
    return sft_warm_start(model_dir, "calculator", env_kwargs, out, sft,
                          tasks=traces, validation_tasks=validation)  # fmt: skip


# ---- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5, help="timed sync trials per path")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument("--model-dir", type=Path, help="a model folder to use instead of "
                        "--shape (e.g. a quickstart run's warm-started sft/ folder)")
    parser.add_argument("--warm-start", type=int, default=0, metavar="STEPS",
                        help="SFT the model on oracle calculator traces first (at most STEPS, "
                        "stopping where the quickstart's warm start does), so episodes call "
                        "the tool (0: the random model, which never does)")  # fmt: skip
    parser.add_argument("--system-prompt", help="the calculator env's system prompt for both "
                        "trainers (a quickstart model was warm-started on the quickstart's)")
    parser.add_argument("--malformed-ends-episode", action="store_true",
                        help="our env ends an episode on a malformed call, as TRL's tool loop "
                        "does (the same workload; by default ours answers with the error)")
    parser.add_argument("--restart", action="store_true", help="also time an engine restart")
    parser.add_argument("--skip-step", action="store_true", help="only the sync bench (b)")
    parser.add_argument("--skip-sync", action="store_true", help="only the step bench (a)")
    parser.add_argument("--engine", default="vllm", choices=("vllm", "hf"),
                        help="our rollout engine in (a); 'hf' keeps TRL on transformers too")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="where both trainers train in (a)")
    parser.add_argument("--steps", type=int, default=WORKLOAD.steps, help="timed steps on "
                        "each side in (a), between a warm-up step and a last step (both "
                        "dropped); more even out what was sampled (8 episodes a step vary in "
                        "length)")
    parser.add_argument("--tasks-per-step", type=int, default=WORKLOAD.tasks_per_step)
    parser.add_argument("--num-generations", type=int, default=WORKLOAD.num_generations)
    parser.add_argument("--trl-completion-length", type=int, metavar="N",
                        help="TRL's budget for a whole completion, tool results included "
                        f"(default: {WORKLOAD.max_completion_length}, our per-turn limit)")
    parser.add_argument("--compare-compiled", action="store_true", help="also time our "
                        "trainer with a compiled vLLM engine (rollout_compile) in the same run")
    parser.add_argument("--compare-overlap", action="store_true", help="also time our trainer "
                        "rolling out the next step during the update (max_staleness=1)")
    parser.add_argument("--repeats", type=int, default=1, help="run every side of (a) this "
                        "many times, the order reversed each time, and pool their steps")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    model_dir = args.model_dir or build_tiny_model(**SHAPES[args.shape])
    trained = ""
    if args.warm_start:
        model_dir = warm_start(model_dir, args.warm_start, args.system_prompt)
        history = json.loads((model_dir / "sft.json").read_text())["history"]
        checked = [h["reference_accuracy"] for h in history if "reference_accuracy" in h]
        trained = f" (stopped at {history[-1]['step']}, validation {checked[-1]:.0%})"
    name = "given" if args.model_dir else args.shape
    print(f"model: {name}, warm start {args.warm_start} SFT steps{trained} ({model_dir})")
    if not args.skip_sync:
        bench_sync(model_dir, args.trials, args.lora_r, args.restart)
    if not args.skip_step:
        workload = dataclasses.replace(
            WORKLOAD, system_prompt=args.system_prompt, engine=args.engine, device=args.device,
            steps=args.steps,
            tasks_per_step=args.tasks_per_step, num_generations=args.num_generations,
            malformed_call_ends_episode=args.malformed_ends_episode,
            trl_max_completion_length=args.trl_completion_length,
        )  # fmt: skip
        bench_step_time(model_dir, workload, compare_compiled=args.compare_compiled,
                        compare_overlap=args.compare_overlap, repeats=args.repeats)  # fmt: skip


if __name__ == "__main__":
    main()
