"""Server lifecycles: our example server over stdio and HTTP, episode vs shared state, crashes,
hangs, error results, and cancellation without leaks."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentgym import ConfigError, EpisodeSpec, ScriptedPolicy, arollout, rollout, run_episode
from agentgym.mcp import MCPServer, MCPToolEnv
from tests.conftest import hermes_call as call
from tests.mcp.conftest import EXAMPLE_SERVER, MISBEHAVING_SERVER, example_notes_server, pid_alive

TASK = [{"prompt": "use the tools"}]


def notes(scope: str = "episode", **kwargs) -> MCPServer:
    return MCPServer(command=sys.executable, args=[str(EXAMPLE_SERVER)], scope=scope, **kwargs)


def replies(trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages if m["role"] == "tool"]


@pytest.fixture
def misbehaving(tmp_path: Path):
    """A factory of specs for the misbehaving server; ``pids()`` lists every start."""
    script = tmp_path / "misbehaving.py"
    script.write_text(MISBEHAVING_SERVER)
    pid_file, started = tmp_path / "pids", tmp_path / "started"

    def spec(scope: str = "episode", **kwargs) -> MCPServer:
        env = {"PID_FILE": str(pid_file), "STARTED_FILE": str(started)}
        return MCPServer(command=sys.executable, args=[str(script)], env=env, scope=scope,
                         **kwargs)  # fmt: skip

    spec.pids = lambda: [int(p) for p in pid_file.read_text().split()]  # type: ignore[attr-defined]
    spec.started = started  # type: ignore[attr-defined]
    return spec


async def until(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


# ---- our example server: stdio and streamable HTTP --------------------------------------------


def test_example_server_over_stdio_writes_and_reads_a_note() -> None:
    env = MCPToolEnv([notes()], tasks=TASK)
    assert set(env.tools) == {"write_note", "read_note", "list_notes", "delete_note"}
    turns = [call("write_note", name="todo", text="buy tea"), call("read_note", name="todo"), "ok"]
    [t] = rollout(lambda: MCPToolEnv([notes()], tasks=TASK), ScriptedPolicy(turns))
    assert t.status == "ok"
    assert replies(t) == ["saved note 'todo' (7 characters)", "buy tea"]


@pytest.fixture
def http_notes_url() -> Iterator[str]:
    with example_notes_server() as url:
        yield url


def test_example_server_over_streamable_http(http_notes_url: str) -> None:
    spec = MCPServer(url=http_notes_url, prefix="notes_")
    assert spec.transport == "http"
    turns = [
        call("notes_write_note", name="todo", text="fix bike"),
        call("notes_read_note", name="todo"),
        call("notes_read_note", name="nope"),
        "ok",
    ]
    [t] = rollout(lambda: MCPToolEnv([spec], tasks=TASK, max_turns=5), ScriptedPolicy(turns))
    assert t.status == "ok"
    assert replies(t)[:2] == ["saved note 'todo' (8 characters)", "fix bike"]
    # an isError result is a tool error the model reads, and the episode goes on
    assert replies(t)[2].startswith("Error: ") and "no note named 'nope'" in replies(t)[2]
    assert t.turns[2].tool_errors and not t.turns[1].tool_errors


# ---- per-episode vs shared state --------------------------------------------------------------


@pytest.mark.parametrize(("scope", "seen"), [("episode", '{"result": []}'), ("shared", "todo")])
def test_episode_state_is_isolated_and_shared_state_is_shared(scope: str, seen: str) -> None:
    def make() -> MCPToolEnv:
        return MCPToolEnv([notes(scope)], tasks=TASK)

    [first] = rollout(make, ScriptedPolicy([call("write_note", name="todo", text="x"), "ok"]))
    [second] = rollout(make, ScriptedPolicy([call("list_notes"), "ok"]))
    assert first.status == second.status == "ok"
    assert replies(second) == [seen]


# ---- infrastructure failures are infra_error; the next episode gets a new server --------------


@pytest.mark.parametrize("scope", ["episode", "shared"])
def test_a_server_that_dies_during_a_call_is_blamed_on_the_call_and_restarts(
    misbehaving, scope
) -> None:
    """The server started afresh works, so the call killed it: not ``infra_error`` (a model
    could escape a low reward that way). An episode's own server takes the episode's world
    with it (forfeited, reward 0); a shared one is a tool error (tests/mcp/test_mcp_blame.py)."""
    spec = misbehaving(scope)
    make = lambda: MCPToolEnv([spec], tasks=TASK)  # noqa: E731
    [crashed] = rollout(make, ScriptedPolicy([call("pid"), call("crash"), "the end"]))
    assert crashed.status == "ok", crashed.error
    dead_pid, error = replies(crashed)
    assert error.startswith("Error: the call of 'crash' crashed the MCP server")
    assert ("forfeit" in crashed.info) == (scope == "episode")
    assert len(crashed.turns) == (2 if scope == "episode" else 3)
    [after] = rollout(make, ScriptedPolicy([call("pid"), "ok"]))
    assert after.status == "ok"
    [new_pid] = replies(after)
    assert new_pid != dead_pid and not pid_alive(int(dead_pid))


def test_a_call_that_hangs_past_the_timeout_is_blamed_on_the_call(misbehaving) -> None:
    spec = misbehaving("shared", call_timeout=1.0)
    make = lambda: MCPToolEnv([spec], tasks=TASK)  # noqa: E731
    [hung] = rollout(make, ScriptedPolicy([call("slow"), call("pid"), "the end"]))
    assert hung.status == "ok", hung.error
    assert replies(hung)[0] == (
        "Error: the call of 'slow' did not finish within 1 s; the shared server was restarted"
    )
    assert replies(hung)[1].isdigit()  # the restarted server answers the episode's next call
    [after] = rollout(make, ScriptedPolicy([call("pid"), "ok"]))
    assert after.status == "ok" and len(misbehaving.pids()) == 2  # a new server


def test_an_error_result_is_the_models_mistake_and_the_episode_goes_on(misbehaving) -> None:
    turns = [call("refuse", reason="not today"), call("pid"), "ok"]
    [t] = rollout(lambda: MCPToolEnv([misbehaving()], tasks=TASK), ScriptedPolicy(turns))
    assert t.status == "ok"
    assert replies(t)[0] == "Error: Error executing tool refuse: not today"
    assert t.turns[0].tool_errors == ["Error executing tool refuse: not today"]
    assert replies(t)[1].isdigit()


async def test_a_server_that_exits_at_its_first_start_is_the_configs_error() -> None:
    """It exits before the handshake every time: no retry can help (exit 2, not 75)."""
    spec = MCPServer(command=sys.executable, args=["-c", "import sys; sys.exit(2)"])
    with pytest.raises(ConfigError, match="failed to start: MCPError: Connection closed; it "
                       "exited with status 2"):  # fmt: skip
        MCPToolEnv([spec], tasks=TASK)
    make = lambda: MCPToolEnv([spec], tasks=TASK)  # noqa: E731
    t = await run_episode(make, ScriptedPolicy(["x"]), EpisodeSpec(0, 0, 0, seed=0))
    assert t.status == "error" and "failed to start" in t.error


# ---- cancellation -----------------------------------------------------------------------------


async def test_cancelling_an_episode_mid_call_stops_its_server(misbehaving) -> None:
    envs: list[MCPToolEnv] = []

    def make() -> MCPToolEnv:
        envs.append(MCPToolEnv([misbehaving()], tasks=TASK))
        return envs[-1]

    policy = ScriptedPolicy([call("slow"), "never"])
    episode = asyncio.create_task(run_episode(make, policy, EpisodeSpec(0, 0, 0, seed=0)))
    await until(misbehaving.started.exists)  # the call is in flight on the server
    [pid] = misbehaving.pids()[-1:]
    assert pid_alive(pid)
    episode.cancel()
    with pytest.raises(asyncio.CancelledError):
        await episode
    await until(lambda: not pid_alive(pid))  # the server process is gone
    assert envs[-1]._connections == [None]  # and the env holds no session


async def test_arollout_of_many_episode_servers_leaves_none_running(misbehaving) -> None:
    """Two episodes at once are enough: each has a server of its own, and none is left."""
    trajectories = await arollout(
        lambda: MCPToolEnv([misbehaving()], tasks=TASK),
        ScriptedPolicy([call("pid"), "ok"]), group_size=2,
    )  # fmt: skip
    assert [t.status for t in trajectories] == ["ok"] * 2
    pids = [int(replies(t)[0]) for t in trajectories]
    assert len(set(pids)) == 2  # one server per episode
    await until(lambda: not any(map(pid_alive, pids)))
