"""Published reference MCP servers (time, git) as tools of an env, driven by rollout.

mcp-server-sqlite is not among them: its last release (2025.4.25) calls the mcp 1.x server
API and dies at start under mcp 2.x.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from agentgym import ScriptedPolicy, rollout
from agentgym.mcp import MCPServer, MCPToolEnv
from tests.conftest import hermes_call as call
from tests.mcp.conftest import venv_server


def tool_replies(trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages if m["role"] == "tool"]


def test_time_server_lists_its_tools_and_converts_a_time() -> None:
    spec = MCPServer(command=venv_server("mcp-server-time"), scope="shared")
    env = MCPToolEnv([spec], tasks=[{"prompt": "What is 12:00 UTC in Tokyo?"}])
    schemas = {s["function"]["name"]: s["function"] for s in env.tool_schemas}
    assert set(schemas) == {"get_current_time", "convert_time"}
    assert schemas["convert_time"]["parameters"]["required"] == [
        "source_timezone", "time", "target_timezone"
    ]  # fmt: skip
    turn = call("convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")
    [t] = rollout(lambda: MCPToolEnv([spec], tasks=env.tasks), ScriptedPolicy([turn, "21:00"]))
    assert t.status == "ok" and not t.turns[0].tool_errors
    [reply] = tool_replies(t)
    assert '"datetime": "' in reply and "T21:00:00+09:00" in reply


def test_git_server_reports_the_status_of_a_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    (repo / "untracked_file.txt").write_text("hello")
    spec = MCPServer(command=venv_server("mcp-server-git"), args=["--repository", str(repo)])
    turns = [call("git_status", repo_path=str(repo)), "done"]
    [t] = rollout(lambda: MCPToolEnv([spec], tasks=[{"prompt": "status?"}]), ScriptedPolicy(turns))
    assert t.status == "ok" and not t.turns[0].tool_errors
    [reply] = tool_replies(t)
    assert "untracked_file.txt" in reply


def test_a_schema_invalid_call_is_the_models_error_and_never_reaches_the_server() -> None:
    spec = MCPServer(command=venv_server("mcp-server-time"), scope="shared")
    tasks = [{"prompt": "What is 12:00 UTC in Tokyo?"}]
    bad = call("convert_time", source_timezone="UTC", time=1200)  # no target; time not a string
    good = call("convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")
    [t] = rollout(lambda: MCPToolEnv([spec], tasks=tasks, max_turns=4),
                  ScriptedPolicy([bad, good, "21:00"]))  # fmt: skip
    assert t.status == "ok"
    first, second = tool_replies(t)
    assert t.turns[0].tool_errors and "target_timezone" in first  # names what is missing
    assert not t.turns[1].tool_errors and "T21:00:00+09:00" in second  # the episode went on
