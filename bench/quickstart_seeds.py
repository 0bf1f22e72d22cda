"""The quickstart's three figures over several seeds: the README's seed table, by a script.

Runs ``agentgym train CONFIG --set seed=S --set output_dir=OUT/seed-S`` once per seed, one after
another (each run alone on the machine: they would share its cores otherwise), times each whole
command from outside (warm start, GRPO, evals and summary: everything but the install; the tiny
model is built once and cached, so only a cold first seed pays its build), reads the figures
the run wrote to its ``summary.json``, and prints the table, the range over the seeds and
whether the quickstart's targets held in every run (issue 7: at most
50% held-out success after the warm start, at least 90% after GRPO, under 10 minutes).

    python bench/quickstart_seeds.py [--seeds 0 1 2] [--config examples/quickstart.yaml]
        [--out runs/quickstart-seeds] [--set KEY=VALUE ...]

A run that fails prints its output's tail and is a row of its own (the other seeds still run);
the script then exits 1. The table is also written to ``OUT/seeds.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

AGENTGYM = Path(sys.executable).parent / "agentgym"
TARGETS = {"sft_at_most": 0.5, "grpo_at_least": 0.9, "seconds_under": 600.0}


def train_one(config: Path, seed: int, out: Path, overrides: list[str]) -> dict[str, Any]:
    """One seed's run, timed from outside; its figures from the summary it wrote."""
    shutil.rmtree(out, ignore_errors=True)
    sets = [arg for item in [f"seed={seed}", f"output_dir={out}", *overrides]
            for arg in ("--set", item)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run([str(AGENTGYM), "train", str(config), *sets],
                          capture_output=True, text=True, check=False)  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        print(f"seed {seed}: agentgym train exited {done.returncode}\n{tail}", file=sys.stderr)
        return {"seed": seed, "seconds": seconds, "error": f"exit {done.returncode}"}
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        return {"seed": seed, "seconds": seconds, "error": f"no summary.json ({exc})"}
    figures, calls = summary.get("figures", {}), summary.get("tool_calls_per_episode", {})
    return {
        "seed": seed, "seconds": seconds, "steps": summary.get("steps"),
        "base": figures.get("base/success"), "sft": figures.get("sft/success"),
        "grpo": figures.get("grpo/success"),
        "calls_first": calls.get("first"), "calls_last": calls.get("last"),
        "warm_start_steps": summary.get("warm_start", {}).get("steps"),
    }  # fmt: skip


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _row(run: dict[str, Any]) -> str:
    minutes, seconds = divmod(round(run["seconds"]), 60)  # 239.6 s is 4 min 0 s, not 3 min 60 s
    wall = f"{minutes} min {seconds} s"
    if "error" in run:
        return f"| {run['seed']} | {run['error']} | | | | {wall} |"
    calls = ("-" if run["calls_first"] is None
             else f"{run['calls_first']:.2f} -> {run['calls_last']:.2f}")  # fmt: skip
    return (f"| {run['seed']} | {_pct(run['base'])} | {_pct(run['sft'])} | **{_pct(run['grpo'])}** "
            f"| {calls} | {wall} |")  # fmt: skip


def _span(values: list[float | None]) -> str:
    """The range of a figure over the seeds ("-" where no run has it: no warm start)."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    low, high = min(present), max(present)
    return _pct(low) if low == high else f"{low:.0%}-{high:.0%}"


def report(runs: list[dict[str, Any]]) -> bool:
    """Print the table and the range; True when every run finished and met every target."""
    print(
        "| seed | base | after SFT | after GRPO | tool calls per episode "
        "(first -> last GRPO step) | wall time, install excluded |\n|---|---|---|---|---|---|"
    )
    for run in runs:
        print(_row(run))
    finished = [run for run in runs if "error" not in run]
    if not finished:
        print("no run finished")
        return False
    print(f"range over {len(finished)} seed(s): {_span([r['base'] for r in finished])} -> "
          f"{_span([r['sft'] for r in finished])} -> {_span([r['grpo'] for r in finished])}, "
          f"at most {max(r['seconds'] for r in finished):.0f} s a run")  # fmt: skip
    met = {  # a run without a warm start (sft_steps 0) has no SFT figure to hold
        f"after SFT <= {TARGETS['sft_at_most']:.0%}":
            all(r["sft"] is None or r["sft"] <= TARGETS["sft_at_most"] for r in finished),
        f"after GRPO >= {TARGETS['grpo_at_least']:.0%}":
            all((r["grpo"] or 0.0) >= TARGETS["grpo_at_least"] for r in finished),
        f"under {TARGETS['seconds_under']:.0f} s":
            all(r["seconds"] < TARGETS["seconds_under"] for r in finished),
    }  # fmt: skip
    for target, held in met.items():
        verdict = "met in every finished run" if held else "NOT met in at least one run"
        print(f"target {target}: {verdict}")
    return len(finished) == len(runs) and all(met.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", type=Path, default=Path("examples/quickstart.yaml"))
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart-seeds"))
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="one more config override for every seed")  # fmt: skip
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        runs.append(train_one(args.config, seed, args.out / f"seed-{seed}", args.overrides))
        print(f"seed {seed} done in {runs[-1]['seconds']:.0f} s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "seeds.json").write_text(json.dumps(runs, indent=1) + "\n")  # before any report
    return 0 if report(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
