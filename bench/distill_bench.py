"""Distillation with the CLI alone: a trained agent's episodes teach the untrained base.

A finished `agentgym train` run (the teacher: its base with its adapter) plays tasks of its
*train* split (`agentgym eval --adapter RUN --tasks ...`); `agentgym sft` fine-tunes the run's
untrained base on the episodes that succeeded (`--trajectories`, the eval's settings read from
its `run.json`); then the base, the teacher and the student are evaluated greedily on the run's
held-out tasks under the same env settings. Prints the four success figures and the times.

    python bench/distill_bench.py RUN_DIR [--record-tasks 200:1200] [--temperature 0.7]
        [--steps 300] [--batch-size 32] [--lr 1e-3] [--target-accuracy X] [--out DIR]

``--target-accuracy X``: the SFT holds back the kept episodes of the last recorded tasks (at
least 128) and stops once X of them are carried out token for token (``--steps`` the cap).

RUN_DIR: e.g. `make quickstart`'s runs/quickstart (its base is `tiny:quickstart`, built here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from agentgym.trainers._recorded_episodes import eval_options

AGENTGYM = Path(sys.executable).parent / "agentgym"


def agentgym(*args: str | Path) -> float:
    """Run one command (failing loudly); returns its wall seconds."""
    started = time.perf_counter()
    done = subprocess.run([str(AGENTGYM), *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "AGENTGYM_RUNS_DB": "off"})
    if done.returncode != 0:
        raise SystemExit(f"agentgym {' '.join(map(str, args))} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def success(folder: Path) -> float:
    return float(json.loads((folder / "summary.json").read_text())["pass@1"])


def as_played(record: Path, student: Path) -> list[str]:
    """The eval options that play the env as the recording did (`agentgym sft`'s own)."""
    run: dict[str, Any] = json.loads((record / "run.json").read_text())
    source = json.loads((student / "sft.json").read_text())["source"]
    return [*eval_options(source), "--max-tokens", str(run["max_tokens"]),
            "--max-model-len", str(run["max_model_len"])]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished agentgym train run folder")
    parser.add_argument("--record-tasks", default="200:1200", help="train tasks to record on")
    parser.add_argument("--temperature", type=float, default=0.7, help="of the recording")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--target-accuracy", type=float, help="stop the SFT at this share of "
                        "held-back kept episodes carried out (default: run every step)")
    parser.add_argument("--out", type=Path, help="keep the recording, the student and the "
                        "evals in this new folder (default: a temporary one)")
    args = parser.parse_args()
    config = yaml.safe_load((args.run / "config.yaml").read_text())
    env, base, held_out = config["env"], config["model"], config["eval_tasks"]
    seed = str(config["seed"])
    with tempfile.TemporaryDirectory(prefix="agentgym-distill-") as scratch:
        work = args.out or Path(scratch)
        record = work / "record"
        record_s = agentgym("eval", env, "--policy", "vllm", "--adapter", args.run,
                            "--tasks", args.record_tasks, "--temperature", args.temperature,
                            "--out", record)  # fmt: skip
        student = work / "student"
        target = ["--target-accuracy", args.target_accuracy] if args.target_accuracy else []
        sft_s = agentgym("sft", base, student, "--trajectories", record / "trajectories.jsonl",
                         "--steps", args.steps, "--batch-size", args.batch_size, "--lr", args.lr,
                         "--seed", seed, *target)  # fmt: skip
        sft = json.loads((student / "sft.json").read_text())
        kept, validation = sft["source"]["kept"], sft["source"].get("validation", 0)
        measured = [r["reference_accuracy"] for r in sft["history"] if "reference_accuracy" in r]
        played = as_played(record, student)
        scores = {}
        # all three under the same seed and env settings: the teacher (its base with the
        # run's adapter), the untrained base, the student
        models: dict[str, list[str | Path]] = {
            "teacher": ["--adapter", args.run], "base": ["--model-path", base],
            "student": ["--model-path", student],
        }  # fmt: skip
        for name, model in models.items():
            agentgym("eval", env, "--policy", "vllm", *model, "--seed", seed,
                     "--tasks", held_out, "--temperature", "0", *played,
                     "--out", work / f"eval-{name}")  # fmt: skip
            scores[name] = success(work / f"eval-{name}")
        scores["recording"] = success(record)
    print(f"recording: the teacher played train tasks {args.record_tasks} at temperature "
          f"{args.temperature}: {scores['recording']:.1%} succeeded ({kept} episodes kept), "
          f"{record_s:.0f} s")
    trained = f"{kept - validation} of the {kept} kept episodes"
    if measured:
        trained += (f" ({validation} held back: {measured[-1]:.0%} of them carried out, target "
                    f"{args.target_accuracy:.0%})")  # fmt: skip
    print(f"sft: {len(sft['history'])} steps on {trained}, {sft_s:.0f} s")
    print(f"held-out success (tasks {held_out}, greedy): base {scores['base']:.0%}, "
          f"teacher {scores['teacher']:.0%}, student {scores['student']:.0%}")


if __name__ == "__main__":
    main()
