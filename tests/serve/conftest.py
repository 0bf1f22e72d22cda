"""Dashboard test fixtures: run folders written by code, a store over them, a live server.

Run folders follow `trainers/_run_dir.py`'s layout (``metrics.jsonl``,
``eval_trajectories.jsonl``, ``status.json``, ``summary.json``, ``config.yaml`` as the store
reads it). Episodes are calculator episodes recorded as the rollout engine records them: token
ids of a byte-level tokenizer (id = byte), each prompt extending the previous turns exactly, so
`Trajectory.flatten` gives the loss mask; the tokenizer is saved as the run's
``tokenizer.json`` so the viewer can decode.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentgym import Trajectory
from agentgym._trajectory import Turn, to_json_line
from tests.conftest import require

#: Message text that would run script if the page ever put model output into HTML.
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 1">'
SYSTEM = "Use the calculate tool, then give the number."


# ---- run folders -------------------------------------------------------------------------------


def save_byte_tokenizer(path: Path) -> None:
    """A byte-level BPE tokenizer.json without merges: token id = byte value."""
    tokenizers = require("tokenizers")
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    # GPT-2's byte-to-character table: printable bytes map to themselves, the rest after 255
    printable = [b for b in range(256) if chr(b).isprintable() and b not in (0x20, 0x7F, 0xAD)]
    table = {b: chr(b) for b in printable}
    extra = iter(sorted(set(alphabet) - set(table.values()), key=ord))
    table |= {b: next(extra) for b in range(256) if b not in table}
    model = tokenizers.models.BPE(vocab={ch: b for b, ch in table.items()}, merges=[])
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    tokenizer.save(str(path))


def _ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def episode(
    a: int,
    b: int,
    *,
    step: int = 0,
    answer: str | None = None,
    tool_error: bool = False,
    status: str = "ok",
    note: str = "",
    results_cut: int = 0,
    cut_turn: bool = False,
) -> Trajectory:
    """A two-turn calculator episode: call ``calculate``, read its result (``results_cut``:
    counted as cut at ``max_tool_result_chars``), answer."""
    expression = f"{a} + {b}"
    result = f"error: cannot parse {expression!r}" if tool_error else str(a + b)
    answer = answer if answer is not None else str(a + b)
    call = {"name": "calculate", "arguments": json.dumps({"expression": expression})}
    call_text = f"<tool_call>{json.dumps(call)}</tool_call>"
    final = f"The answer is {answer}.{note}"
    prompt1 = _ids(f"<system>{SYSTEM}\n<user>What is {expression}?{note}\n<assistant>")
    prompt2 = prompt1 + _ids(call_text) + _ids(f"\n<tool>{result}\n<assistant>")
    correct = float(answer == str(a + b))
    turns = [
        Turn(prompt1, _ids(call_text), [-0.1] * len(_ids(call_text)), None, call_text, "stop",
             tool_errors=[f"calculate: {result}"] if tool_error else [],
             tool_results_cut=results_cut),
        Turn(prompt2, _ids(final), [-0.2] * len(_ids(final)), None, final,
             "length" if cut_turn else "stop"),
    ]  # fmt: skip
    for turn in turns:
        turn.completion_mask = [1] * len(turn.completion_ids or [])
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What is {expression}?{note}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1_0", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "call_1_0", "name": "calculate", "content": result},
        {"role": "assistant", "content": final},
    ]  # fmt: skip
    return Trajectory(
        env_id="calculator",
        task={"prompt": f"What is {expression}?", "answer": str(a + b)},
        task_index=a,
        messages=messages,
        turns=turns,
        final_reward=correct,
        scores={"correct_answer": correct, "used_calculator": 1.0},
        status=status,  # type: ignore[arg-type]
        info={"step": step},
        mode="concat",
    )


def metrics_line(step: int, reward: float) -> str:
    """One ``metrics.jsonl`` line of a GRPO step, as `RunDir.write_metrics` writes it."""
    record = {
        "step": step, "time": 1796034000.0 + step, "data/tasks": [step, step + 1],
        "reward/mean": reward, "reward/correct_answer/mean": reward,
        "reward/used_calculator/mean": min(1.0, reward + 0.2), "loss/kl": 0.01 * step,
        "loss/entropy": 1.0 / (step + 1), "rollout/completion_length": 20.0 + step,
        "rollout/tool_calls_per_episode": 0.5 + reward / 2, "rollout/tool_error_rate": 0.1,
    }  # fmt: skip
    return json.dumps(record) + "\n"


@dataclass
class RunFolder:
    """A run folder on disk and what was written into it."""

    id: str
    path: Path
    trajectories: list[Trajectory]
    rewards: list[float]
    config: dict[str, Any] = field(default_factory=dict)
    kind: str = "train"

    def record(self) -> dict[str, Any]:
        """The run as the store describes it (the `RunStore` keys)."""
        status = json.loads((self.path / "status.json").read_text())
        summary = json.loads((self.path / "summary.json").read_text())
        return {
            "id": self.id, "kind": self.kind, "name": f"calc-{self.id}", "status": status["state"],
            "run_dir": str(self.path), "created_at": status["started_at"], "step": status["step"],
            "figures": summary["figures"], "config": self.config,
        }  # fmt: skip


def write_run(
    root: Path,
    run_id: str,
    *,
    rewards: list[float],
    trajectories: list[Trajectory],
    tokenizer: bool = True,
    config: dict[str, Any] | None = None,
) -> RunFolder:
    """A finished run folder with one metrics line per reward and the given episodes."""
    path = root / run_id
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text(
        "".join(metrics_line(step, r) for step, r in enumerate(rewards, start=1))
    )
    (path / "eval_trajectories.jsonl").write_text("".join(map(to_json_line, trajectories)))
    status = {"state": "finished", "started_at": f"2026-11-30T10:{len(run_id):02d}:00+00:00",
              "step": len(rewards)}  # fmt: skip
    (path / "status.json").write_text(json.dumps(status))
    (path / "summary.json").write_text(json.dumps({"figures": {"grpo/success": rewards[-1]}}))
    if tokenizer:
        save_byte_tokenizer(path / "tokenizer.json")
    return RunFolder(run_id, path, trajectories, rewards, config or {"model": "/no/such/model"})


class DirStore:
    """The two `RunStore` methods over run folders made by `write_run`."""

    def __init__(self, *runs: RunFolder) -> None:
        self.runs = {run.id: run for run in runs}

    def list_runs(self, limit: int = 200) -> list[dict[str, Any]]:
        records = [run.record() for run in self.runs.values()]
        return sorted(records, key=lambda r: r["created_at"], reverse=True)[:limit]

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        run = self.runs.get(run_id)
        return run.record() if run is not None else None


def standard_episodes() -> list[Trajectory]:
    """Ten episodes covering what the viewer must show and filter."""
    episodes = [episode(40 + i, 50 + i, step=10, results_cut=int(i == 2)) for i in range(6)]
    episodes.append(episode(7, 8, step=20, tool_error=True, answer="16"))  # reward 0
    episodes.append(episode(3, 4, step=20, status="truncated", answer="0", cut_turn=True))
    episodes.append(episode(1, 2, step=20, note=" " + "very long " * 40))  # length outlier
    episodes.append(episode(5, 6, step=20, note=XSS))
    return episodes


# ---- a live server -----------------------------------------------------------------------------


@dataclass
class Dashboard:
    """A dashboard served by uvicorn on loopback, over a `DirStore`."""

    url: str
    store: DirStore


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread on an ephemeral loopback port; yield its URL."""
    require("uvicorn")
    from agentgym.serve._thread import serve_in_thread

    with serve_in_thread(app) as url:
        yield url


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """Runs ``a`` (finished, 10 episodes, tokenizer) and ``b`` (other curve, no tokenizer)."""
    fastapi = require("fastapi")
    from agentgym.serve._dashboard import dashboard_router

    root = tmp_path_factory.mktemp("runs")
    run_a = write_run(
        root, "a", rewards=[0.1, 0.3, 0.5, 0.6, 0.8], trajectories=standard_episodes()
    )
    run_b = write_run(
        root, "bb", rewards=[0.0, 0.2, 0.2, 0.4], trajectories=[episode(1, 1)], tokenizer=False
    )
    store = DirStore(run_a, run_b)
    app = fastapi.FastAPI()
    app.include_router(dashboard_router(store))
    with serve(app) as url:
        yield Dashboard(url, store)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    """An empty SQLite run store (`agentgym.runs.RunStore`) in the test's folder, then closed."""
    from agentgym.runs import RunStore

    store = RunStore(str(tmp_path / "runs.db"))
    yield store
    store.close()


@contextlib.contextmanager
def sick_run(dashboard: Dashboard, root: Path) -> Iterator[RunFolder]:
    """Run ``sick`` in the dashboard's store while the block runs: 60% of its tool calls fail."""
    run = write_run(root, "sick", rewards=[0.1, 0.2, 0.2, 0.3], trajectories=[episode(1, 1)])
    lines = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    (run.path / "metrics.jsonl").write_text(
        "".join(json.dumps({**line, "rollout/tool_error_rate": 0.6}) + "\n" for line in lines)
    )
    dashboard.store.runs[run.id] = run
    try:
        yield run
    finally:
        del dashboard.store.runs[run.id]


@contextlib.contextmanager
def eval_run(dashboard: Dashboard, root: Path) -> Iterator[RunFolder]:
    """Eval run ``ev`` in the dashboard's store while the block runs: 2 of its 3 calls fail."""
    episodes = [episode(1, 2, tool_error=True), episode(3, 4, tool_error=True), episode(5, 6)]
    lines = "".join(map(to_json_line, episodes))
    with other_run(dashboard, root, "ev", "eval", {"trajectories.jsonl": lines}) as run:
        yield run


@contextlib.contextmanager
def other_run(
    dashboard: Dashboard, root: Path, run_id: str, kind: str, files: dict[str, str]
) -> Iterator[RunFolder]:
    """A finished run of ``kind`` holding ``files``, in the dashboard's store while it runs."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "status.json").write_text(
        json.dumps({"state": "finished", "step": 0, "started_at": "2026-11-30T11:00:00+00:00"})
    )
    (root / "summary.json").write_text(json.dumps({"figures": {}}))
    run = RunFolder(run_id, root, [], [], kind=kind)
    dashboard.store.runs[run.id] = run
    try:
        yield run
    finally:
        del dashboard.store.runs[run.id]
