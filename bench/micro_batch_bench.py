"""One GRPO update on a step's samples: the trainer's micro-batch split vs one padded pass.

A pass pads its rows to the longest one, so a step where one episode took a second turn used
to pad every other row to that episode's width. The trainer now cuts a step's samples where
that is less work (`agentgym.trainers._samples.micro_batches`, `PASS_COST_TOKENS`). This
times `GRPOTrainer._update` (forward, backward, optimiser step: what ``time/train`` of a step
mostly is) on the same samples both ways, trials alternating, with the split forced off by
setting the pass cost out of reach. The update is the same either way
(`tests/trainers/test_distributed.py`).

The steps are the shapes of real ones: token counts of ``bench/trainer_bench.py --skip-sync``
steps on the tiny model (calculator, 2 tasks x 4 episodes, 715 prompt tokens every episode
shares), with random token ids after the shared prompt.

    python bench/micro_batch_bench.py [--trials 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentgym.engine.tiny import build_tiny_model
from agentgym.trainers import GRPOConfig, GRPOTrainer, LossSpec, Sample, _samples

SHARED_PROMPT = 715
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


def time_update(trainer: GRPOTrainer, parts: tuple[Any, Any], samples: list[Sample],
                split: bool) -> float:
    """Seconds of one `_update` on ``samples``, with the trainer's split on or off."""
    cpu_cost = _samples.PASS_COST_TOKENS["cpu"]
    if not split:
        _samples.PASS_COST_TOKENS["cpu"] = 10**9  # a pass then costs more than any padding
    try:
        spec = LossSpec.from_config(trainer.config, max_turns=trainer.env_max_turns)
        started = time.perf_counter()
        trainer._update(*parts, samples, spec)
        return time.perf_counter() - started
    finally:
        _samples.PASS_COST_TOKENS["cpu"] = cpu_cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()

    model_dir = build_tiny_model()
    config = GRPOConfig(
        model=str(model_dir), env="calculator", device="cpu", lora_r=16, lora_alpha=32,
        max_model_len=2048, report_to=["none"],
        output_dir=tempfile.mkdtemp(prefix="agentgym-bench-"),
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    model, optimizer = trainer._trainable(Path(model_dir))
    vocab = int(model.config.vocab_size)
    print(f"GRPO update (forward, backward, AdamW) on the tiny model, cpu, median of "
          f"{args.trials} alternating trials after a warm-up")  # fmt: skip
    for name, lengths in STEPS.items():
        samples = step_samples(lengths, vocab)
        passes = [tuple(p.input_ids.shape) for p in trainer._micro_batches(model, samples)]
        times: dict[bool, list[float]] = {True: [], False: []}
        for trial in range(args.trials + 1):
            for split in (True, False):
                seconds = time_update(trainer, (model, optimizer), samples, split)
                if trial:  # the first round warms both up
                    times[split].append(seconds)
        cut, whole = (statistics.median(times[s]) for s in (True, False))
        print(f"  {name:<20} split {cut * 1000:6.1f} ms {passes}  vs one pass "
              f"{whole * 1000:6.1f} ms  ->  one pass / split {whole / cut:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
