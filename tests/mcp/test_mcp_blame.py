"""Who is to blame when a model's MCP call crashes or hangs its server.

An ``infra_error`` episode is dropped from group statistics, not scored 0, so a model that
could end its own failing episode that way would escape its low reward. A call that kills or
hangs the server is the model's doing while a fresh start of the same server answers. With
an episode's own server the episode is then forfeited (`Forfeit`: it ends, reward 0, the
rubric not run): its world went with the server, and scoring the restarted world would let
a model undo its mistakes by crashing it. With a shared server it is a tool error and the
episode goes on. Only a server that cannot be started afresh is infrastructure.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from agentgym import EpisodeSpec, Rubric, ScriptedPolicy, run_episode
from agentgym.mcp import MCPServer, MCPToolEnv, _connection
from tests.conftest import hermes_call as call
from tests.mcp.conftest import pid_alive
from tests.mcp.test_mcp_lifecycle import TASK, replies, until

#: A server the model's arguments can crash or hang. Every start appends "pid cwd" to $LOG;
#: it exits at start once $MARKER is gone and hangs at start once $HANG exists. Its async
#: tools block its event loop: it cannot even see its stdin close.
BLAME_SERVER = textwrap.dedent('''
    import os, signal, sys, threading, time
    from mcp.server.mcpserver import MCPServer

    with open(os.environ["LOG"], "a") as f:
        f.write(f"{os.getpid()} {os.getcwd()}\\n")
    if not os.path.exists(os.environ["MARKER"]):
        sys.exit("the marker file is gone")
    if os.path.exists(os.environ["HANG"]):
        time.sleep(3600)

    server = MCPServer("blame", log_level="WARNING")
    notes = []

    @server.tool()
    def pid() -> str:
        """This server's process id."""
        return str(os.getpid())

    @server.tool()
    def crash(x: str) -> str:
        """Exit at once when x is 'boom' (an input the server does not handle)."""
        if x == "boom":
            os._exit(1)
        return f"fine: {x}"

    @server.tool()
    async def slow(seconds: float) -> str:
        """Block the server's loop for this long."""
        time.sleep(seconds)
        return "slept"

    @server.tool()
    async def stubborn() -> str:
        """Block the server's loop for an hour; a SIGTERM only touches $TERMED."""
        signal.signal(signal.SIGTERM, lambda *_: open(os.environ["TERMED"], "w").close())
        time.sleep(3600)
        return "woke up"

    @server.tool()
    def note(text: str) -> str:
        """Keep a note in memory; returns every note kept."""
        notes.append(text)
        return ",".join(notes)

    @server.tool()
    def crash_later(seconds: float) -> str:
        """Answer now, exit after this many seconds."""
        threading.Timer(seconds, os._exit, [1]).start()
        return "scheduled"

    @server.tool()
    def unmark() -> str:
        """Delete the marker every start needs, then exit."""
        os.remove(os.environ["MARKER"])
        os._exit(1)

    @server.tool()
    def wedge() -> str:
        """Make every later start hang, then exit."""
        open(os.environ["HANG"], "w").close()
        os._exit(1)

    server.run()
''')

FORFEIT = "the episode's world went with the server, so the episode ends here with reward 0"


class Blame:
    """Specs of `BLAME_SERVER` in a test's folder, and what its starts logged."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.script = folder / "blame_server.py"
        self.script.write_text(BLAME_SERVER)
        self.template = folder / "template"
        self.template.mkdir()
        (folder / "marker").touch()

    def spec(self, scope: str = "episode", **options) -> MCPServer:
        files = ("LOG", "MARKER", "HANG", "TERMED")
        env = {name: str(self.folder / name.lower()) for name in files}
        if scope == "episode":  # a copy per start, so a test sees copies left behind
            options.setdefault("workspace", str(self.template))
        return MCPServer(command=sys.executable, args=[str(self.script)], env=env, scope=scope,
                         **options)  # fmt: skip

    def starts(self) -> list[tuple[int, str]]:
        """(pid, cwd) of every start so far, oldest first."""
        lines = (self.folder / "log").read_text().split("\n")
        return [(int(pid), cwd) for pid, cwd in (line.split(" ", 1) for line in lines if line)]

    async def all_gone(self) -> None:
        """Wait (bounded) until no started server runs and no workspace copy is left.

        Bounded, not at once: a close keeps going on the MCP loop after a cancelled episode.
        """
        starts = self.starts()
        copies = [Path(cwd) for _, cwd in starts if cwd != str(Path.cwd())]
        await until(lambda: not any(pid_alive(pid) for pid, _ in starts))
        await until(lambda: not any(copy.exists() for copy in copies))


@pytest.fixture
def blame(tmp_path: Path) -> Blame:
    return Blame(tmp_path)


async def play(env: MCPToolEnv, turns: list[str]):
    return await run_episode(lambda: env, ScriptedPolicy(turns), EpisodeSpec(0, 0, 0, seed=0))


def notes_kept(completion: str) -> float:
    """A reward that would pay the episodes below: it must not be run after a forfeit."""
    return 1.0


async def test_a_call_that_crashes_the_episodes_server_forfeits_the_episode(
    blame: Blame,
) -> None:
    env = MCPToolEnv([blame.spec()], tasks=TASK, max_turns=8, rubric=Rubric([notes_kept]))
    turns = [call("note", text="before"), call("pid"), call("crash", x="boom"), call("pid"),
             "done"]  # fmt: skip

    t = await play(env, turns)

    assert t.status == "ok", t.error  # scored, not dropped as infra_error
    assert (t.final_reward, t.scores) == (0.0, {"notes_kept": 0.0})  # the rubric did not run
    kept, _, crashed = replies(t)  # the episode ended with the turn that crashed it
    assert kept == "before" and len(t.turns) == 3 and t.turns[2].tool_errors
    assert crashed.startswith("Error: the call of 'crash' crashed the MCP server (")
    assert crashed.endswith(FORFEIT) and t.info["forfeit"].startswith("crash: the call of")
    assert len(blame.starts()) == 3  # listing, the episode's, the fresh start that answered
    await blame.all_gone()


async def test_calls_that_crash_the_server_together_share_one_fresh_server(blame: Blame) -> None:
    env = MCPToolEnv([blame.spec()], tasks=TASK, max_turns=5)
    both = call("crash", x="boom") + call("crash", x="boom")  # one turn, two parallel calls

    t = await play(env, [both, call("crash", x="calm"), "done"])

    assert t.status == "ok" and t.final_reward == 0.0, t.error
    assert len(t.turns) == 1 and len(t.turns[0].tool_errors) == 2
    assert all(r.startswith("Error: the call of 'crash'") for r in replies(t))
    assert len(blame.starts()) == 3  # listing, the episode's, one fresh start for both
    await blame.all_gone()


async def test_a_call_that_hangs_past_call_timeout_forfeits_the_episode(blame: Blame) -> None:
    env = MCPToolEnv([blame.spec(call_timeout=1.0)], tasks=TASK, max_turns=5)

    t = await play(env, [call("pid"), call("slow", seconds=600), call("pid"), "done"])

    assert t.status == "ok" and t.final_reward == 0.0, t.error
    hung_pid, hung = replies(t)
    assert hung == f"Error: the call of 'slow' did not finish within 1 s; {FORFEIT}"
    await until(lambda: not pid_alive(int(hung_pid)))  # the hung process was killed
    await blame.all_gone()


async def test_a_server_that_cannot_start_again_is_infra_error(blame: Blame) -> None:
    env = MCPToolEnv([blame.spec()], tasks=TASK)

    t = await play(env, [call("unmark"), "never"])

    assert t.status == "infra_error"
    assert "MCPServerError: MCP server" in t.error
    assert "failed during the call of 'unmark'" in t.error
    assert "starting it afresh failed too" in t.error and "failed to start" in t.error
    assert len(blame.starts()) == 3  # listing, the episode's, the fresh start that failed
    await blame.all_gone()


@pytest.mark.parametrize("scope", ["episode", "shared"])
async def test_cancelled_while_the_fresh_server_starts_leaves_nothing(
    blame: Blame, scope: str
) -> None:
    env = MCPToolEnv([blame.spec(scope, start_timeout=120)], tasks=TASK)
    started = len(blame.starts())
    episode = asyncio.create_task(play(env, [call("wedge"), "never"]))
    await until(lambda: len(blame.starts()) == started + (1 if scope == "shared" else 2))
    hanging, _ = blame.starts()[-1]
    assert pid_alive(hanging) and not episode.done()  # the fresh start hangs at start

    episode.cancel()
    with pytest.raises(asyncio.CancelledError):
        await episode

    await blame.all_gone()
    assert env._connections == [None]


async def test_cancelled_while_the_hung_server_is_stopped_leaves_nothing(blame: Blame) -> None:
    env = MCPToolEnv([blame.spec(call_timeout=1.0)], tasks=TASK)
    episode = asyncio.create_task(play(env, [call("stubborn"), "never"]))
    termed = blame.folder / "termed"
    await until(termed.exists)  # timed out; the hung server is being stopped (SIGKILL next)
    hung, _ = blame.starts()[-1]
    assert pid_alive(hung) and not episode.done()
    assert env._connections[0] is not None  # stopped mid-episode, to blame: not in teardown

    episode.cancel()
    with pytest.raises(asyncio.CancelledError):
        await episode

    await blame.all_gone()  # killed all the same, and its workspace copy removed
    assert env._connections == [None]


async def test_a_crashed_shared_server_is_a_tool_error_and_replaced_for_every_episode(
    blame: Blame,
) -> None:
    """A shared server's world is not the episode's (and another episode's call may have
    crashed it): the model reads a tool error and goes on with the restarted server."""
    spec = blame.spec("shared")
    env = MCPToolEnv([spec], tasks=TASK, max_turns=5)

    t = await play(env, [call("pid"), call("crash", x="boom"), call("pid"), "done"])

    assert t.status == "ok" and "forfeit" not in t.info, t.error
    old_pid, crashed, new_pid = replies(t)
    assert crashed.startswith("Error: the call of 'crash' crashed the MCP server")
    assert crashed.endswith("; the shared server was restarted")
    assert new_pid != old_pid and not pid_alive(int(old_pid))
    assert _connection._shared[spec.key()].broken is False
    after = await play(MCPToolEnv([spec], tasks=TASK), [call("pid"), "done"])
    assert replies(after) == [new_pid]  # the replacement is the process's shared server
    assert len(blame.starts()) == 2


async def read_after_death(env: MCPToolEnv) -> float:
    """A reward that waits until the episode's server died, then reads the world."""
    await until(lambda: not pid_alive(int(replies_of(env)[0])))
    return float(await env.call_mcp_tool("note", {"text": "read"}) == "read")


async def pays_a_clean_world(env: MCPToolEnv) -> float:
    """A second reward that pays a world without the episode's note: a fresh server's."""
    return float("before" not in await env.call_mcp_tool("note", {"text": "x"}))


def replies_of(env: MCPToolEnv) -> list[str]:
    return [m["content"] for m in env.messages if m["role"] == "tool"]


async def test_a_read_of_a_server_the_model_left_dead_forfeits_the_episode(blame: Blame) -> None:
    """The model made its server die after answering: the reward's read gets no answer. A
    fresh server answers, so the world the model left broke the read: the episode is
    forfeited (reward 0, not infra_error), and no reward reads the fresh world, which would
    pay an episode whose changes a crash undid."""
    spec = blame.spec()
    rubric = Rubric([read_after_death, pays_a_clean_world])
    left_dead = MCPToolEnv([spec], tasks=TASK, rubric=rubric, max_turns=5)
    turns = [call("pid"), call("note", text="before"), call("crash_later", seconds=0.1), "done"]

    t = await play(left_dead, turns)

    assert t.status == "ok" and t.final_reward == 0.0, t.error  # scored, not dropped
    assert t.scores == {"read_after_death": 0.0, "pays_a_clean_world": 0.0}
    assert t.info["forfeit"].startswith("a reward's read: MCP server")
    assert len(blame.starts()) == 3  # listing, the episode's, one fresh start (no second read)
    await blame.all_gone()


async def test_a_call_that_never_ran_on_a_shared_server_is_sent_to_the_fresh_one(
    blame: Blame,
) -> None:
    """Another episode broke the shared server: a call of this one that finds it stopped did
    nothing, so it is sent to the fresh server, not blamed on this model."""
    spec = blame.spec("shared")
    first = MCPToolEnv([spec], tasks=TASK, max_turns=5)
    await first.areset(options={"task": 0})
    await first.astep(call("crash", x="boom"))  # breaks the shared server; replaced at once
    second = MCPToolEnv([spec], tasks=TASK, max_turns=5)
    await second.areset(options={"task": 0})
    broken = _connection._shared[spec.key()]
    await _connection.on_hub(broken.close())  # as if the other episode had just broken it
    obs, *_ = await second.astep(call("pid"))
    assert obs[-1]["content"].isdigit(), obs[-1]  # answered by a fresh server, no error
    for env in (first, second):
        await env.aclose()
