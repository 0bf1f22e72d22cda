"""``agentgym eval --policy openai``'s token figures from a server that returns no token ids.

Why: most OpenAI-compatible servers (anything but vLLM asked for ``return_token_ids``) send
no ids but do send ``usage.completion_tokens``; the summary's ``tokens/completions_total`` and
``tokens/per_episode`` were null for them (checked: the code before this count wrote null), the
dashboard showed 0 tokens a turn, and ``max_episode_tokens`` never spent. The count is kept on
the turn, never as ids (a trainer must not train on made-up ids), and ids, where the server
sends them, win.
The server is a small stdlib one on loopback, played by the real command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agentgym import Completion, read_jsonl
from agentgym._trajectory import Trajectory
from agentgym.serve._dashboard import detail
from tests.conftest import send_json, serving
from tests.test_tool_env import call, make_env

AGENTGYM = Path(sys.executable).parent / "agentgym"


class _Handler(BaseHTTPRequestHandler):
    """Serves model ``m``; each reply is a final answer, with the fields in ``extra``."""

    extra: ClassVar[dict[str, Any]] = {}
    ids: ClassVar[list[int] | None] = None

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        send_json(self, 200, {"data": [{"id": "m"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        choice: dict[str, Any] = {
            "message": {"role": "assistant", "content": "The answer is 5."},
            "finish_reason": "stop",
        }
        if self.ids is not None:
            choice["token_ids"] = self.ids
        send_json(self, 200, {"choices": [choice], **self.extra})

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the command's files."""


class _Usage(_Handler):
    extra: ClassVar[dict[str, Any]] = {"usage": {"prompt_tokens": 40, "completion_tokens": 7}}


class _Neither(_Handler):
    pass


class _IdsAndUsage(_Usage):
    ids: ClassVar[list[int] | None] = [11, 12, 13]


class _BadUsage(_Handler):
    extra: ClassVar[dict[str, Any]] = {"usage": {"completion_tokens": True}}


def evaluate(handler: type[BaseHTTPRequestHandler], out: Path) -> tuple[dict, list[Trajectory]]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "AGENTGYM_RUNS_DB": "off"}
    env.pop("OPENAI_API_KEY", None)
    with serving(handler) as url:
        proc = subprocess.run(
            [str(AGENTGYM), "eval", "calculator", "--policy", "openai", "--base-url",
             f"{url}/v1", "--model", "m", "-n", "2", "--out", str(out)],
            cwd=out.parent, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    return summary, list(read_jsonl(out / "trajectories.jsonl"))


@pytest.mark.parametrize(
    ("handler", "total", "ids", "counts"),
    [
        (_Usage, 14, None, [7, 7]),
        (_Neither, None, None, [None, None]),
        (_IdsAndUsage, 6, [11, 12, 13], [None, None]),
        (_BadUsage, None, None, [None, None]),  # true is no count: left out, the turn kept
    ],
    ids=["usage_without_ids", "neither", "ids_win", "usage_not_a_count"],
)
def test_the_token_figures_come_from_ids_else_from_usage(
    tmp_path: Path,
    handler: type[BaseHTTPRequestHandler],
    total: int | None,
    ids: list[int] | None,
    counts: list[int | None],
) -> None:
    summary, episodes = evaluate(handler, tmp_path / "out")
    assert [t.status for t in episodes] == ["ok", "ok"]
    assert summary["tokens/completions_total"] == total
    assert summary["tokens/per_episode"] == (None if total is None else total / 2)
    turns = [turn for t in episodes for turn in t.turns]
    assert [turn.completion_ids for turn in turns] == [ids, ids]  # never ids made of a count
    assert [turn.completion_tokens for turn in turns] == counts


def test_a_file_written_before_the_count_still_reads_and_round_trips(tmp_path: Path) -> None:
    """A line without ``completion_tokens`` (an older agentgym's) reads as no count."""
    _, [episode, _] = evaluate(_Usage, tmp_path / "out")
    record = episode.to_dict()
    assert Trajectory.from_dict(json.loads(json.dumps(record))) == episode
    for turn in record["turns"]:
        del turn["completion_tokens"]
    assert Trajectory.from_dict(record).turns[0].completion_tokens is None


def test_a_server_count_spends_the_episode_token_budget_and_shows_on_the_dashboard() -> None:
    """The budget counted ids alone: against a server sending only ``usage`` it never spent,
    and the dashboard showed 0 tokens for turns ``summary.json`` counted."""
    env = make_env(max_episode_tokens=10)
    env.reset(options={"task": 0})
    turn = Completion(text=call("add", a=2, b=3), completion_tokens=6)
    *_, truncated, _ = env.step(turn)
    assert not truncated and env.state.completion_tokens == 6
    *_, terminated, truncated, _ = env.step(turn)
    assert truncated and not terminated
    shown = detail(env.as_trajectory(), 0, {})["turns"]
    assert [t["completion_tokens"] for t in shown] == [6, 6]
