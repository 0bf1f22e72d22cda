"""What a policy's (or its server's) text must not do to ``agentgym eval``: crash it, garble it.

Why: a reply with a lone surrogate (JSON ``"\\ud800"``) made writing its episode raise, so
the eval died in a traceback mid-run, and every ``--resume`` again; a proxy's 502 page with
escape sequences was printed raw in the error line, clearing the screen and writing the
reader's clipboard (OSC 52). The server is a small stdlib one in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from agentgym import read_jsonl
from agentgym._eval_folder import previous_episodes
from agentgym._trajectory import Trajectory, Turn
from tests.conftest import serving

AGENTGYM = Path(sys.executable).parent / "agentgym"
SURROGATE_REPLY = "The answer is \ud800 5."
ESCAPES = "<html>\x1b]52;c;cHduZWQ=\x07\x1b[2Jgone</html>"


class _Handler(BaseHTTPRequestHandler):
    """Lists model ``m``; answers a surrogate reply, or a raw 502 page when ``broken``."""

    broken = False

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._send(200, json.dumps({"data": [{"id": "m"}]}).encode())

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.broken:
            self._send(502, ESCAPES.encode())
            return
        message = {"role": "assistant", "content": SURROGATE_REPLY}
        body = {"choices": [{"message": message, "finish_reason": "stop"}]}
        self._send(200, json.dumps(body).encode())  # ASCII: the surrogate as "\ud800"

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the CLI's output."""


class _Broken(_Handler):
    broken = True





def run(out: Path, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "AGENTGYM_RUNS_DB": "off"}
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(
        [str(AGENTGYM), "eval", "calculator", "--policy", "openai", "--base-url", f"{url}/v1",
         "--model", "m", "-n", "2", "--out", str(out)],
        cwd=out.parent, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_reply_with_a_lone_surrogate_is_recorded_as_it_came(tmp_path: Path) -> None:
    with serving(_Handler) as url:
        proc = run(tmp_path / "out", url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    episodes = list(read_jsonl(tmp_path / "out" / "trajectories.jsonl"))
    assert [t.turns[0].text for t in episodes] == [SURROGATE_REPLY] * 2
    assert [t.status for t in episodes] == ["ok", "ok"]


def test_a_resume_rewriting_the_file_keeps_a_surrogate_reply(tmp_path: Path) -> None:
    """Resumed, the file is rewritten without its infra_error episodes: that write raised."""
    kept = Trajectory("e", task_index=0, task_position=0, turns=[Turn(text=SURROGATE_REPLY)])
    failed = Trajectory("e", task_index=1, task_position=1, status="infra_error")
    results = tmp_path / "trajectories.jsonl"
    results.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in (kept, failed)))
    (tmp_path / "run.json").write_text(json.dumps({"tasks_sha256": "x"}))
    done = previous_episodes(tmp_path, {"tasks_sha256": "x"}, resume=True)
    assert [t.turns[0].text for t in done] == [SURROGATE_REPLY]
    assert [t.turns[0].text for t in read_jsonl(results)] == [SURROGATE_REPLY]


def test_a_servers_escape_sequences_are_shown_escaped_in_the_error_line(tmp_path: Path) -> None:
    with serving(_Broken) as url:
        proc = run(tmp_path / "out", url)
    assert proc.returncode == 75, proc.stderr[-2000:]
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert "\\x1b]52;c;cHduZWQ=\\x07" in proc.stderr


def test_a_library_user_writes_and_reads_back_a_lone_surrogate(tmp_path: Path) -> None:
    """`write_jsonl` raised UnicodeEncodeError on it too, for users of the library."""
    from agentgym import write_jsonl

    episode = Trajectory(env_id="x", turns=[Turn(text=SURROGATE_REPLY)])
    write_jsonl([episode], tmp_path / "t.jsonl")
    (tmp_path / "t.jsonl").read_text(encoding="utf-8")  # valid UTF-8
    [back] = read_jsonl(tmp_path / "t.jsonl")
    assert back.turns[0].text == SURROGATE_REPLY


def test_every_commands_error_line_shows_escape_sequences_as_text(capsys) -> None:
    from agentgym._cli_common import print_error

    print_error(f"the server said {ESCAPES}")
    said = capsys.readouterr().err
    assert "\x1b" not in said and "\\x1b]52;c;" in said
