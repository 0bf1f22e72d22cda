"""One GRPO update (forward, backward, optimiser step) both ways, trials alternating.

Each trial times both ways, their order swapped trial by trial (so neither always runs
first); a first trial of both warms them up, off the record.

This is what ``time/train`` of a step mostly is. Two of the trainer's choices are timed
against the way they replaced, on the same samples; the update is the same either way
(`tests/trainers/test_distributed.py`, `tests/trainers/test_prefix.py`).

1. Micro-batches cut by cost (`agentgym.trainers._samples.micro_batches`, `PASS_COST_TOKENS`)
   against one padded pass (the cut forced off by setting the pass cost out of reach). A pass
   pads its rows to the longest, so a step where one episode took a second turn used to pad
   every other row to that episode's width. Tiny model.
2. Logits only where the loss reads them (`agentgym.trainers._prefix.logits_to_keep`, the model's
   ``logits_to_keep``) against logits for every position, on the tiny model's layers with
   Qwen2.5's 151,936-token vocabulary (random weights), on one task's 4 episodes: seconds, and
   the peak resident memory the update adds (Linux ``VmHWM``, reset before each update).

The steps are the shapes of real ones: token counts of ``bench/trainer_bench.py --skip-sync``
steps on the tiny model (calculator, 2 tasks x 4 episodes, 715 prompt tokens every episode
shares), with random token ids after the shared prompt.

    python bench/update_bench.py [--trials 7]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

from agentgym.engine.tiny import build_tiny_model
from agentgym.trainers import GRPOConfig, GRPOTrainer, LossSpec, Sample, _grpo, _samples

SHARED_PROMPT = 715
#: Qwen2.5's vocabulary size.
QWEN_VOCABULARY = 151_936
#: Sample lengths of steps seen in the step bench: one episode took a second turn; a few did;
#: every episode took one turn (nothing to cut: both ways should time the same).
STEPS = {
    "one second turn": [759, 763, 763, 763, 1278, 763, 763, 763],
    "a few second turns": [957, 980, 722, 757, 763, 743, 758, 719],
    "one turn each": [756, 763, 763, 763, 763, 763, 763, 763],
}


def step_samples(lengths: list[int], vocab: int, seed: int = 0) -> list[Sample]:
    """Samples of ``lengths`` tokens sharing `SHARED_PROMPT` tokens, loss on the rest."""
    rng = random.Random(seed)
    prompt = [rng.randrange(vocab) for _ in range(SHARED_PROMPT)]
    samples = []
    for episode, length in enumerate(lengths):
        rest = length - SHARED_PROMPT
        samples.append(Sample(
            input_ids=prompt + [rng.randrange(vocab) for _ in range(rest)],
            loss_mask=[0] * SHARED_PROMPT + [1] * rest,
            engine_logprobs=[None] * SHARED_PROMPT + [rng.uniform(-4.0, -1.0) for _ in range(rest)],
            advantage=rng.uniform(-1.5, 1.5), episode=episode,
        ))  # fmt: skip
    return samples


def _peak_rss_reset() -> None:
    """Start a new resident-memory high-water mark (Linux: ``VmHWM`` := ``VmRSS``)."""
    Path("/proc/self/clear_refs").write_text("5")


def _memory_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _way(mine: bool, knob: str) -> contextlib.AbstractContextManager[Any]:
    """The trainer as it is (``mine``), or with ``knob`` set back to the way it replaced."""
    if mine:
        return contextlib.nullcontext()
    if knob == "split":  # a pass then costs more than any padding
        return mock.patch.dict(_samples.PASS_COST_TOKENS, {"cpu": 10**9})
    return mock.patch.object(_grpo, "logits_to_keep", lambda trained: trained.shape[1])


def time_update(trainer: GRPOTrainer, parts: tuple[Any, Any], samples: list[Sample],
                mine: bool, knob: str) -> tuple[float, float]:
    """Seconds of one `_update` on ``samples``, and the resident MiB it added at its peak."""
    spec = LossSpec.from_config(trainer.config, max_turns=trainer.env_max_turns)
    with _way(mine, knob):
        _peak_rss_reset()
        before = _memory_mib("VmRSS")
        started = time.perf_counter()
        trainer._update(*parts, samples, spec)
        seconds = time.perf_counter() - started
        return seconds, _memory_mib("VmHWM") - before


def compare(trainer: GRPOTrainer, model_dir: Path, knob: str, steps: dict[str, list[int]],
            trials: int) -> list[str]:
    """Both ways on each step's samples, alternating; a printed line per step."""
    model, optimizer = trainer._trainable(model_dir)
    lines = []
    for name, lengths in steps.items():
        samples = step_samples(lengths, int(model.config.vocab_size))
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for trial in range(trials + 1):
            for mine in (True, False) if trial % 2 == 0 else (False, True):  # order alternates
                figures = time_update(trainer, (model, optimizer), samples, mine, knob)
                if trial:  # the first round warms both up
                    runs[mine].append(figures)
        (ours, our_mib), (theirs, their_mib) = (
            (statistics.median(s for s, _ in runs[m]), max(b for _, b in runs[m]))
            for m in (True, False)
        )
        if knob == "split":
            passes = [tuple(p.input_ids.shape) for p in trainer._micro_batches(model, samples)]
            lines.append(f"  {name:<20} cut {ours * 1000:6.1f} ms {passes}  vs one pass "
                         f"{theirs * 1000:6.1f} ms  ->  one pass / cut "
                         f"{theirs / ours:.2f}")  # fmt: skip
        else:
            lines.append(f"  {name:<20} kept {ours * 1000:7.1f} ms, +{our_mib:6.0f} MiB peak  vs "
                         f"all {theirs * 1000:7.1f} ms, +{their_mib:6.0f} MiB  ->  "
                         f"{theirs / ours:.2f}x the time, {their_mib / max(our_mib, 1):.1f}x "
                         "the memory")  # fmt: skip
    return lines


def trainer_for(model_dir: Path) -> GRPOTrainer:
    return GRPOTrainer(GRPOConfig(
        model=str(model_dir), env="calculator", device="cpu", lora_r=16, lora_alpha=32,
        max_model_len=2048, report_to=["none"],
        output_dir=tempfile.mkdtemp(prefix="agentgym-bench-"),
    ))  # fmt: skip


def with_vocabulary(model_dir: Path, vocab: int, out: Path) -> Path:
    """``model_dir``'s shape and tokenizer with a ``vocab``-row embedding, random weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    config.vocab_size = vocab
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for name in model_dir.iterdir():
        if "token" in name.name or name.name.endswith(".jinja"):
            shutil.copy(name, out / name.name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()

    tiny = build_tiny_model()
    print(f"GRPO update (forward, backward, AdamW), cpu, median of {args.trials} alternating "
          "trials after a warm-up")  # fmt: skip
    print("1. micro-batches cut by cost vs one padded pass, tiny model")
    print("\n".join(compare(trainer_for(tiny), tiny, "split", STEPS, args.trials)))
    with tempfile.TemporaryDirectory(prefix="agentgym-vocab-") as folder:
        big = with_vocabulary(tiny, QWEN_VOCABULARY, Path(folder))
        print(f"2. logits kept where the loss reads them vs all, tiny model's layers with a "
              f"{QWEN_VOCABULARY:,}-token vocabulary")  # fmt: skip
        # one task's 4 episodes: all logits of 8 rows would take 18 GB of a 24 GB machine
        steps = {"one turn, 4 episodes": STEPS["one turn each"][:4]}
        print("\n".join(compare(trainer_for(big), big, "logits", steps, args.trials)))


if __name__ == "__main__":
    main()
