"""What the MCP probe 55 found: specs with paths or ints, shared servers timed by another env,
a workspace copy that froze every session, a dead shared server retried once per episode,
unresolvable ``$ref``s, server stderr on the terminal, start failures that named no cause,
and servers left running after their parent was killed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from agentgym import ConfigError
from agentgym._tools import Tool
from agentgym.mcp import MCPServer, MCPToolEnv, _connection
from agentgym.mcp._connection import checkout, on_hub
from tests.conftest import hermes_call as call
from tests.mcp.conftest import ROOT, pid_alive
from tests.mcp.test_mcp_blame import Blame, play
from tests.mcp.test_mcp_lifecycle import TASK, replies, until

#: A raw JSON-RPC server (no SDK: it starts at once). It appends its pid to $PID_FILE, says
#: "NOISE at start" on stderr, and lists $TOOLS (JSON; default: one tool "t").
NOISY_SERVER = textwrap.dedent("""
    import json, os, sys
    if os.environ.get("PID_FILE"):
        with open(os.environ["PID_FILE"], "a") as f:
            f.write(f"{os.getpid()}\\n")
    print("NOISE at start", file=sys.stderr, flush=True)
    TOOLS = json.loads(os.environ.get("TOOLS") or
                       '[{"name": "t", "inputSchema": {"type": "object"}}]')
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        if msg["method"] == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"],
                      "capabilities": {"tools": {}},
                      "serverInfo": {"name": "noisy", "version": "0"}}
        elif msg["method"] == "tools/list":
            result = {"tools": TOOLS}
        else:
            result = {"content": [{"type": "text", "text": "called"}]}
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
""")


@pytest.fixture
def blame(tmp_path: Path) -> Blame:
    return Blame(tmp_path)


@pytest.fixture
def noisy(tmp_path: Path) -> Path:
    script = tmp_path / "noisy_server.py"
    script.write_text(NOISY_SERVER)
    return script


# ---- 1. paths and ints in args / env ----------------------------------------------------------


def test_a_path_in_args_is_its_text_and_an_int_in_env_is_refused_at_once(noisy: Path) -> None:
    """Before: a Path in args hung start_timeout, then failed with a TypeError; an int in env
    hung start_timeout and then said "did not start"."""
    spec = MCPServer(command=Path(sys.executable), args=[noisy], cwd=noisy.parent)  # type: ignore[arg-type,list-item]
    assert spec.args == (str(noisy),) and spec.cwd == str(noisy.parent)
    assert isinstance(spec.command, str) and str(noisy) in spec.label
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"env\['DEBUG'\] must be a string, got int 1"):
        MCPServer(command=sys.executable, args=[str(noisy)], env={"DEBUG": 1})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"args\[1\] must be a string, got int"):
        MCPServer(command=sys.executable, args=[str(noisy), 3])  # type: ignore[list-item]
    assert time.monotonic() - started < 1


# ---- 2. a shared server's calls are timed by each env's own spec ------------------------------


async def test_each_env_times_its_calls_of_a_shared_server_with_its_own_call_timeout(
    blame: Blame,
) -> None:
    """Before: the env that started the shared server first (call_timeout=1) set the limit of
    every env's calls: the patient env's 2 s call was cut at 1 s and the server restarted."""
    MCPToolEnv([blame.spec("shared", call_timeout=1)], tasks=TASK)  # starts the shared server
    patient = MCPToolEnv([blame.spec("shared", call_timeout=30)], tasks=TASK, max_turns=3)

    t = await play(patient, [call("slow", seconds=2), "done"])

    assert t.status == "ok", t.error
    assert replies(t) == ["slept"]
    assert len(blame.starts()) == 1


# ---- 3. a workspace copy runs in a thread -----------------------------------------------------


async def test_a_workspace_copy_does_not_stall_the_mcp_loop(
    noisy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the copy ran on the hub loop, so every session's calls stalled for as long as
    it took, and calls in flight timed out (forfeits nobody caused)."""
    import shutil

    copytree = shutil.copytree

    def slow_copytree(*args, **kwargs):
        time.sleep(1.5)  # a big workspace
        return copytree(*args, **kwargs)

    monkeypatch.setattr(shutil, "copytree", slow_copytree)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    spec = MCPServer(command=sys.executable, args=[str(noisy)], workspace=str(workspace))
    starting = asyncio.ensure_future(checkout(spec))
    await asyncio.sleep(0.2)  # the copy is under way
    lags = []
    while not starting.done():
        began = time.monotonic()
        await on_hub(asyncio.sleep(0))
        lags.append(time.monotonic() - began)
    connection = await starting
    await on_hub(connection.close())
    assert max(lags) < 0.5, lags


async def test_a_start_cancelled_during_the_workspace_copy_leaves_no_copy(
    noisy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil
    import threading

    copytree, copying = shutil.copytree, threading.Event()

    def slow_copytree(*args, **kwargs):
        copying.set()
        time.sleep(1.0)
        return copytree(*args, **kwargs)

    monkeypatch.setattr(shutil, "copytree", slow_copytree)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "f.txt").write_text("x")
    spec = MCPServer(command=sys.executable, args=[str(noisy)], workspace=str(workspace))
    starting = asyncio.ensure_future(checkout(spec))
    await until(copying.is_set)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await until(lambda: not list(temp.glob("agentgym-mcp-*")))
    await asyncio.sleep(1.2)  # past the copy's end: nothing reappears
    assert not list(temp.glob("agentgym-mcp-*"))


# ---- 4. a shared server that cannot start fails its queued episodes at once -------------------


async def test_episodes_queued_behind_a_failed_shared_start_fail_at_once(blame: Blame) -> None:
    """Before: each queued episode waited its turn and then a start_timeout of its own: 4
    episodes took 4 start timeouts to end infra_error."""
    # 15 s: the first start is a real one (0.8-1.5 s idle); 2 s was too little for it once on
    # a loaded CI, and 6 s is under what a machine 10x slower in bursts needs
    spec = blame.spec("shared", start_timeout=15)
    MCPToolEnv([spec], tasks=TASK)  # lists: the first start works
    wedged = await play(MCPToolEnv([spec], tasks=TASK, max_turns=3), [call("wedge"), "done"])
    assert wedged.status == "infra_error"  # its restart hung
    started = time.monotonic()

    ts = await asyncio.gather(
        *(
            play(MCPToolEnv([spec], tasks=TASK, max_turns=3), [call("pid"), "done"])
            for _ in range(4)
        )
    )

    assert [t.status for t in ts] == ["infra_error"] * 4
    assert all("did not start within 15 s" in (t.error or "") for t in ts)
    assert time.monotonic() - started < 10  # at once: not a start timeout each (4 x 15 s)
    _connection._failed_starts.clear()


# ---- 5. an unresolvable $ref is refused when the tool is made ---------------------------------


@pytest.mark.parametrize(
    "ref", ["#/$defs/Nope", "https://example.invalid/s.json", "#/definitions/X"]
)
def test_a_schema_whose_ref_does_not_resolve_is_refused_at_build(ref: str) -> None:
    """Before: accepted; every call of the tool then crashed the episode (a jsonschema
    traceback, status "error")."""
    schema = {"type": "object", "properties": {"x": {"$ref": ref}}}
    with pytest.raises(ConfigError, match=r"tool 't'.*properties/x.*\$ref") as error:
        Tool(fn=lambda **_: "", name="t", description="", parameters=schema)
    assert ref in str(error.value) and "\n" not in str(error.value)


def test_schemas_whose_refs_resolve_are_accepted() -> None:
    schema = {
        "type": "object",
        "$defs": {"N": {"type": "integer"}},
        "definitions": {"M": {"type": "string"}},
        "properties": {
            "a": {"$ref": "#/$defs/N"},
            "b": {"$ref": "#/definitions/M"},
            "default": {"type": "object", "const": {"$ref": "not a schema: data"}},
            "c": {"$id": "https://x.example/c", "$defs": {"K": {"type": "string"}},
                  "$ref": "#/$defs/K"},
        },
    }  # fmt: skip
    tool = Tool(fn=lambda **_: "", name="t", description="", parameters=schema)
    assert tool.validate({"a": 1, "b": "s", "c": "k"}) == {"a": 1, "b": "s", "c": "k"}


def test_an_mcp_tool_with_an_unresolvable_ref_is_a_config_error_naming_it(noisy: Path) -> None:
    schema = {"type": "object", "properties": {"x": {"$ref": "#/$defs/Nope"}}}
    tools = [{"name": "t", "inputSchema": schema}]
    spec = MCPServer(command=sys.executable, args=[str(noisy)], env={"TOOLS": json.dumps(tools)})
    with pytest.raises(ConfigError, match=r"lists tool 't'.*'#/\$defs/Nope'.*tools=\[\.\.\.\]"):
        MCPToolEnv([spec], tasks=TASK)


# ---- 6. server stderr goes to a log file, not the terminal ------------------------------------


def test_server_stderr_goes_to_its_log_file_by_default(
    noisy: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Before: every server's logs and tracebacks went to our terminal."""
    spec = MCPServer(command=sys.executable, args=[str(noisy)], scope="shared")
    MCPToolEnv([spec], tasks=TASK)
    _connection.close_shared_servers()
    assert "NOISE" not in capfd.readouterr().err
    assert spec.log_path is not None and os.path.basename(spec.log_path).startswith("mcp-")
    assert "NOISE at start" in Path(spec.log_path).read_text()
    os.remove(spec.log_path)


def test_server_stderr_to_a_file_or_nowhere(
    noisy: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "server.log"
    spec = MCPServer(command=sys.executable, args=[str(noisy)], stderr=str(log), scope="shared")
    MCPToolEnv([spec], tasks=TASK)
    gone = MCPServer(command=sys.executable, args=[str(noisy), "x"], stderr="discard")
    MCPToolEnv([gone], tasks=TASK)
    _connection.close_shared_servers()
    assert "NOISE" not in capfd.readouterr().err
    assert log.read_text().count("NOISE at start") == 1
    assert spec.log_path == str(log) and gone.log_path is None
    with pytest.raises(ConfigError, match="does not exist"):
        MCPServer(command=sys.executable, stderr=str(tmp_path / "no" / "such.log"))


# ---- 7. a start failure names its cause and the fix -------------------------------------------


def test_a_server_that_exits_at_its_first_start_is_a_config_error_quoting_its_stderr(
    tmp_path: Path,
) -> None:
    """Before: "failed to start: MCPError: Connection closed", an InfraError (exit 75, which
    a queue retries for ever), the real cause only on the terminal."""
    spec = MCPServer(command=sys.executable, args=[str(tmp_path / "sever.py")])
    with pytest.raises(ConfigError) as error:
        MCPToolEnv([spec], tasks=TASK)
    message = str(error.value)
    assert (
        "failed to start: MCPError: Connection closed; it exited with status 2 before the MCP"
        in message
    )
    assert "can't open file" in message and "sever.py" in message
    assert "check command, args" in message and "\n" not in message


async def test_a_server_that_stops_starting_later_is_still_infra(blame: Blame) -> None:
    """A start that worked before (the listing) and fails in an episode may be the machine's:
    infra_error (retried), not a config error; its stderr is quoted."""
    spec = blame.spec("episode")
    env = MCPToolEnv([spec], tasks=TASK, max_turns=3)
    (blame.folder / "marker").unlink()  # every later start exits: "the marker file is gone"

    t = await play(env, [call("pid"), "done"])

    assert t.status == "infra_error"
    assert "exited with status 1" in (t.error or "") and "the marker file is gone" in (
        t.error or ""
    )


def test_a_command_line_in_command_is_told_to_split() -> None:
    with pytest.raises(ConfigError, match=r"give command='.*python.*', args=\['server.py'\]"):
        MCPServer(command=f"{sys.executable} server.py")


def test_a_url_that_is_not_found_is_told_about_mcp() -> None:
    spec = MCPServer(url="http://127.0.0.1:9/sse")
    failure = _connection._start_failure(RuntimeError("Not Found"), spec)
    assert "try url='http://127.0.0.1:9/mcp'" in failure
    plain = _connection._start_failure(RuntimeError("Not Found"), MCPServer(url="http://h:9/mcp"))
    assert "/mcp" not in plain.replace("http://h:9/mcp", "")


# ---- 8. servers die with their parent ---------------------------------------------------------

#: Starts an episode server with a workspace, says "ready", and waits to be killed.
KILLED_PARENT = textwrap.dedent("""
    import asyncio, sys
    from agentgym.mcp import MCPServer, MCPToolEnv

    script, pid_file, workspace = sys.argv[1:]
    spec = MCPServer(command=sys.executable, args=[script], workspace=workspace,
                     env={"PID_FILE": pid_file})
    env = MCPToolEnv([spec], tasks=[{"prompt": "x"}])

    async def main():
        await env.setup_episode({"prompt": "x"})
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
async def test_servers_die_with_a_killed_parent_and_its_copies_are_swept(
    noisy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    """Before: a library script killed with SIGTERM (timeout, Slurm, docker stop) left its
    servers running under init, in sessions of their own, and their workspace copies."""
    child, pid_file = tmp_path / "child.py", tmp_path / "pids"
    child.write_text(KILLED_PARENT)
    workspace, temp = tmp_path / "ws", tmp_path / "temp"
    workspace.mkdir()
    temp.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(child), str(noisy), str(pid_file), str(workspace)], cwd=ROOT,
        stdout=subprocess.PIPE, env={**os.environ, "TMPDIR": str(temp)},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready"
        process.send_signal(signum)
        process.wait(timeout=30)
        pids = [int(p) for p in pid_file.read_text().split()]
        assert len(pids) == 2  # the listing's server and the episode's
        await until(lambda: not any(pid_alive(p) for p in pids), seconds=10)
    finally:
        process.kill()
        for pid in pids if "pids" in locals() else []:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert list(temp.glob("agentgym-mcp-*"))  # the dead process's copy is left ...
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # a new temp dir: swept at first use
    connection = await checkout(
        MCPServer(command=sys.executable, args=[str(noisy)], workspace=str(workspace))
    )
    try:  # ... until the next process starts a server with a workspace
        assert [p.name for p in temp.glob("agentgym-mcp-*")] == [
            os.path.basename(connection.workspace or "")
        ]
    finally:
        await on_hub(connection.close())
