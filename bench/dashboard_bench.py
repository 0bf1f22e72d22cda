"""Dashboard load time on a run with 10,000 trajectories, measured over HTTP on loopback.

Generates a run folder (in a temporary directory) shaped like a trainer's: ``metrics.jsonl``
with one line per step and ``eval_trajectories.jsonl`` with N calculator episodes, synthetic
but realistic: one to three turns, tool calls and their results, tool errors, every status,
long-tail completion lengths, byte-level token ids (the ``tiny`` model's first 256 ids are
the bytes, so the viewer decodes them with the rebuilt tiny tokenizer) and per-token logprobs.

Then serves the dashboard with uvicorn on 127.0.0.1 and times, as a browser would request
them (wall time of each request on loopback, i.e. server time plus a local round trip):

- the runs page: HTML, script, stylesheet and ``/api/runs``;
- the run page's curves (every curve's points);
- the first trajectory page: cold (the JSONL is indexed, once) and warm (index cached);
- a filtered page (tool errors, length outliers) and the last page;
- a page after 50 more episodes were appended (the index is extended, not rebuilt);
- a trajectory detail: cold (the tokenizer is loaded once) and warm;

each with the response size in bytes. Warm figures are the median and max of ``--repeat``
requests.

    python bench/dashboard_bench.py [--trajectories 10000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from agentgym import Trajectory
from agentgym._trajectory import STATUSES, Status, Turn, to_json_line
from agentgym.serve._dashboard import dashboard_router
from agentgym.serve._thread import serve_in_thread

SYSTEM = "Use the calculate tool, then give the number."
EPISODES_PER_STEP = 50
RUN_ID = "bench"


# ---- a synthetic run -------------------------------------------------------------------------


def _ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _turn(prompt: list[int], text: str, rng: random.Random, errors: list[str]) -> Turn:
    completion = _ids(text)
    logprobs = [round(-abs(rng.gauss(0, 0.6)), 4) for _ in completion]
    return Turn(prompt, completion, logprobs, [1] * len(completion), text, "stop",
                reward=0.0, tool_errors=errors, policy_seconds=rng.uniform(0.05, 2.0),
                adapter_version=rng.randint(0, 40))  # fmt: skip


def make_episode(i: int, rng: random.Random) -> Trajectory:
    """One calculator episode: up to two tool calls, then an answer (or not, when cut)."""
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    expression, answer = f"{a} + {b}", a + b
    status: Status = rng.choices(STATUSES, weights=[85, 8, 3, 2, 2])[0]  # type: ignore[assignment]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What is {expression}?"},
    ]
    rendered = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is {expression}?"
    turns: list[Turn] = []
    for call in range(rng.choice([0, 1, 1, 1, 2])):
        broken = rng.random() < 0.05
        arguments = json.dumps({"expression": expression + (" +" if broken else "")})
        text = f'<tool_call>\n{{"name": "calculate", "arguments": {arguments}}}\n</tool_call>'
        result = f"error: invalid syntax in {expression} +" if broken else str(answer)
        prompt = _ids(rendered + "<|im_end|>\n<|im_start|>assistant\n")
        turns.append(_turn(prompt, text, rng, [f"calculate: {result}"] if broken else []))
        call_id = f"call_{len(turns)}_{call}"
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [{"id": call_id,
             "type": "function", "function": {"name": "calculate", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "name": "calculate", "content": result},
        ]  # fmt: skip
        rendered += f"<|im_end|>\n<|im_start|>assistant\n{text}<|im_end|>\n"
        rendered += f"<|im_start|>user\n<tool_response>\n{result}\n</tool_response>"
    said = answer if rng.random() < 0.8 else answer + rng.randint(1, 9)
    filler = (
        " Let me double check the sum." * int(rng.paretovariate(2.0)) if rng.random() < 0.2 else ""
    )
    final = f"The answer is {said}.{filler}"
    turns.append(_turn(_ids(rendered + "<|im_end|>\n<|im_start|>assistant\n"), final, rng, []))
    messages.append({"role": "assistant", "content": final})
    correct = float(said == answer and status == "ok")
    used = float(any(m["role"] == "tool" for m in messages))
    return Trajectory(
        env_id="calculator", task={"prompt": f"What is {expression}?", "answer": str(answer)},
        task_index=i % 2000, task_position=i % EPISODES_PER_STEP, seed=i, messages=messages,
        turns=turns, final_reward=correct if status not in ("infra_error", "late") else None,
        scores={"correct_answer": correct, "used_calculator": used}, status=status,
        error="Traceback ...\nRuntimeError: boom" if status == "error" else None,
        timings={"total": sum(t.policy_seconds for t in turns)},
        info={"step": (i // EPISODES_PER_STEP) * 10}, mode="concat",
    )  # fmt: skip


def write_run(folder: Path, count: int, seed: int = 0) -> Path:
    """A run folder with ``count`` eval episodes and one metrics line per 10 steps."""
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    with (folder / "eval_trajectories.jsonl").open("w", encoding="utf-8") as f:
        f.writelines(to_json_line(make_episode(i, rng)) for i in range(count))
    steps = max(1, count // EPISODES_PER_STEP) * 10
    with (folder / "metrics.jsonl").open("w", encoding="utf-8") as f:
        for step in range(1, steps + 1):
            progress = step / steps
            record = {
                "step": step, "time": 1796034000.0 + step, "reward/mean": progress,
                "reward/correct_answer/mean": progress, "reward/used_calculator/mean": 1.0,
                "loss/kl": 0.001 * step, "loss/entropy": 1.0 - 0.5 * progress,
                "rollout/completion_length": 30 + 10 * rng.random(),
                "rollout/tool_calls_per_episode": 0.5 + progress / 2,
                "rollout/tool_error_rate": 0.05 * rng.random(),
            }  # fmt: skip
            f.write(json.dumps(record) + "\n")
    return folder


class OneRunStore:
    """The dashboard's `RunStore` over the generated folder."""

    def __init__(self, folder: Path) -> None:
        self.run = {
            "id": RUN_ID, "kind": "train", "name": "dashboard-bench", "status": "finished",
            "run_dir": str(folder), "created_at": "2026-11-30T10:00:00+00:00", "step": 0,
            "figures": {"grpo/success": 0.9}, "config": {"model": "tiny", "seed": 0},
        }  # fmt: skip

    def list_runs(self, limit: int = 200) -> list[dict[str, Any]]:
        return [self.run][:limit]

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        return self.run if run_id == RUN_ID else None


# ---- serving and timing ----------------------------------------------------------------------


def fetch(client: httpx.Client, urls: list[str]) -> tuple[float, int]:
    """Seconds and bytes to GET ``urls`` one after the other (each must succeed)."""
    start, size = time.perf_counter(), 0
    for url in urls:
        response = client.get(url)
        response.raise_for_status()
        size += len(response.content)
    return time.perf_counter() - start, size


def report(name: str, timed: Callable[[], tuple[float, int]], repeat: int) -> None:
    """Print one row: the cold request, then the median and max of ``repeat`` warm ones."""
    cold, size = timed()
    warm = [timed()[0] for _ in range(repeat)] if repeat else []
    warm_text = (
        f"{statistics.median(warm) * 1000:8.1f} {max(warm) * 1000:8.1f}" if warm else " " * 17
    )
    print(f"{name:<34} {cold * 1000:8.1f} {warm_text} {size:>10,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20, help="warm requests per row")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        folder = write_run(Path(tmp) / "run", args.trajectories)
        jsonl = folder / "eval_trajectories.jsonl"
        print(f"generated {args.trajectories:,} trajectories ({jsonl.stat().st_size:,} bytes) "
              f"in {time.perf_counter() - start:.1f} s")  # fmt: skip
        app = FastAPI()
        app.include_router(dashboard_router(OneRunStore(folder)))
        api = f"/api/runs/{RUN_ID}"
        curves = "&".join(f"key={k}" for k in ("reward/*", "loss/*", "rollout/*"))
        last = (args.trajectories - 1) // 50 * 50
        with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=120) as client:

            def get(urls: list[str]) -> Callable[[], tuple[float, int]]:
                return lambda: fetch(client, urls)

            print(f"{'request (ms; bytes)':<34} {'cold':>8} {'median':>8} {'max':>8} {'bytes':>10}")
            report(
                "runs page (html+js+css+api)",
                get(["/", "/static/dashboard.js", "/static/dashboard.css", "/api/runs"]),
                args.repeat,
            )
            report("run page: curves", get([api, f"{api}/metrics?{curves}"]), args.repeat)
            report(
                "first trajectory page (cold: index)",
                get([f"{api}/trajectories?limit=50"]),
                args.repeat,
            )
            report(
                "filtered page (tool errors)",
                get([f"{api}/trajectories?tool_errors=true&limit=50"]),
                args.repeat,
            )
            report(
                "filtered page (length outliers)",
                get([f"{api}/trajectories?length_outliers=true&limit=50"]),
                args.repeat,
            )
            report("last page", get([f"{api}/trajectories?offset={last}&limit=50"]), args.repeat)
            rng = random.Random(1)
            with jsonl.open("a", encoding="utf-8") as f:
                f.writelines(to_json_line(make_episode(i, rng)) for i in range(50))
            report("page after 50 appended (extend)", get(
                [f"{api}/trajectories?limit=50"]), 0)  # fmt: skip
            middle = args.trajectories // 2
            report(
                "trajectory detail (cold: tokenizer)",
                get([f"{api}/trajectories/{middle}"]),
                args.repeat,
            )


if __name__ == "__main__":
    main()
