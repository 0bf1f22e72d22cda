"""`MCPServer(workspace=...)`: a server that keeps its state on disk starts each episode on a
fresh copy, so nothing one episode writes there reaches the next one or its group's siblings.

A new process alone is not enough: mcp-server-git on a repository sees every branch an
earlier episode created, and a reward reading that state would pay the later episode for it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentgym import ConfigError, ScriptedPolicy, rollout
from agentgym.mcp import MCPServer, MCPToolEnv
from tests.conftest import hermes_call as call
from tests.mcp.conftest import venv_server

#: A stdio server that reports where it runs and what it was given, and writes files there.
WHERE_SERVER = textwrap.dedent('''
    import os, sys
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("where", log_level="WARNING")

    @server.tool()
    def where() -> str:
        """cwd | the argument after --data | $DATA_DIR"""
        return f"{os.getcwd()}|{sys.argv[sys.argv.index('--data') + 1]}|{os.environ['DATA_DIR']}"

    @server.tool()
    def plant(name: str) -> str:
        """Write a file in the data folder; list what is there."""
        folder = sys.argv[sys.argv.index('--data') + 1]
        open(os.path.join(folder, name), "w").close()
        return ",".join(sorted(os.listdir(folder)))

    server.run()
''')


def tool_replies(trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages if m["role"] == "tool"]


def git_repo(path: Path) -> Path:
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(path)], check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], check=True, timeout=30)
    return path


def test_a_branch_made_in_one_episode_is_not_in_the_next(tmp_path: Path) -> None:
    template = git_repo(tmp_path / "repo")
    spec = MCPServer(command=venv_server("mcp-server-git"), workspace=str(template))
    tasks = [{"prompt": "make a branch"}]
    make_branch = [call("git_create_branch", repo_path=".", branch_name="planted"), "done"]
    list_branches = [call("git_branch", repo_path=".", branch_type="local"), "done"]

    [first] = rollout(lambda: MCPToolEnv([spec], tasks=tasks), ScriptedPolicy(make_branch))
    [second] = rollout(lambda: MCPToolEnv([spec], tasks=tasks), ScriptedPolicy(list_branches))

    assert first.status == second.status == "ok", (first.error, second.error)
    assert "planted" in tool_replies(first)[0]
    [branches] = tool_replies(second)
    assert "master" in branches or "main" in branches
    assert "planted" not in branches  # the second episode got a fresh copy
    listed = subprocess.run(["git", "-C", str(template), "branch"], capture_output=True,
                            text=True, check=True, timeout=30).stdout  # fmt: skip
    assert "planted" not in listed  # the template itself is never written


def test_the_copy_is_named_in_args_env_and_cwd_and_removed_after_the_episode(
    tmp_path: Path,
) -> None:
    server = tmp_path / "where_server.py"
    server.write_text(WHERE_SERVER)
    template = tmp_path / "data"
    template.mkdir()
    (template / "seed.txt").write_text("x")
    spec = MCPServer(command=sys.executable, args=[str(server), "--data", "{workspace}"],
                     env={"DATA_DIR": "{workspace}/sub"}, workspace=str(template))  # fmt: skip
    turns = [call("where"), call("plant", name="planted.txt"), "done"]

    [t] = rollout(lambda: MCPToolEnv([spec], tasks=[{"prompt": "?"}], max_turns=4),
                  ScriptedPolicy(turns))  # fmt: skip

    assert t.status == "ok", t.error
    where, planted = tool_replies(t)
    cwd, data, data_dir = where.split("|")
    assert cwd == data != str(template) and data_dir == f"{data}/sub"
    assert planted == "planted.txt,seed.txt"  # the copy holds the template's files
    assert sorted(p.name for p in template.iterdir()) == ["seed.txt"]
    assert not Path(data).exists()  # removed once the episode's server stopped


def test_a_relative_command_still_starts_in_another_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command is found from here when the spec is made; the server may run elsewhere."""
    server = Path(venv_server("mcp-server-time"))
    monkeypatch.chdir(server.parent)
    spec = MCPServer(command=f"./{server.name}", cwd=str(tmp_path), scope="shared")
    env = MCPToolEnv([spec], tasks=[{"prompt": "?"}])
    assert {s["function"]["name"] for s in env.tool_schemas} == {"get_current_time", "convert_time"}


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"scope": "shared"}, "scope='episode'"),
        ({"workspace": "/no/such/folder"}, "is not a folder"),
    ],
)
def test_a_workspace_that_cannot_work_is_refused_up_front(
    tmp_path: Path, options: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        MCPServer(command=sys.executable, **{"workspace": str(tmp_path), **options})
