"""MCP: tool use against real MCP servers; by default a key-value notes store of ours.

Why: MCP is how tools are published today, so an env family whose tools *are* MCP servers
lets a policy train on any of them unchanged (`agentgym.mcp` does the plumbing). With no
``servers`` the env plays a world that needs nothing installed: a notes store written with the
SDK's ``MCPServer`` (FastMCP), one process per episode, and tasks that ask to save a note.
The reward reads the store through the server at the end of the episode, so only a note that
was really saved counts, whatever the model claims.

Run the store on its own (for an HTTP-served world, or to try it with an MCP client)::

    python -m agentgym.envs.mcp              # stdio
    python -m agentgym.envs.mcp --http 8000  # streamable HTTP on http://127.0.0.1:8000/mcp
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from typing import Any

from agentgym import Rubric, ToolCall, ToolError
from agentgym._tasks import check_num_tasks
from agentgym.mcp import MCPServer, MCPToolEnv

_NAMES = ("groceries", "todo", "ideas", "meeting", "books", "travel", "gifts", "recipes")
_WORDS = ("milk", "eggs", "call", "mom", "paint", "fence", "read", "dune", "pack", "tent",
          "buy", "tea", "fix", "bike", "plan", "trip", "bake", "bread")  # fmt: skip

#: The notes store, one process per episode (its state is the episode's world).
NOTES_SERVER = MCPServer(command=sys.executable, args=("-m", "agentgym.envs.mcp"))


def notes_server() -> Any:
    """The notes store: an ``mcp.server.mcpserver.MCPServer`` (FastMCP) with four tools."""
    from mcp.server.mcpserver import MCPServer as FastMCP
    from mcp.server.mcpserver.exceptions import ToolError as Refused  # an answer, not a crash

    server = FastMCP(
        "agentgym-notes", instructions="A key-value store of short text notes.", log_level="WARNING"
    )
    notes: dict[str, str] = {}

    @server.tool()
    def write_note(name: str, text: str) -> str:
        """Save ``text`` as the note ``name``, replacing any note of that name."""
        notes[name] = text
        return f"saved note {name!r} ({len(text)} characters)"

    @server.tool()
    def read_note(name: str) -> str:
        """Return the text of the note ``name``."""
        if name not in notes:
            raise Refused(f"no note named {name!r}; notes: {sorted(notes)}")
        return notes[name]

    @server.tool()
    def list_notes() -> list[str]:
        """The names of all notes, sorted."""
        return sorted(notes)

    @server.tool()
    def delete_note(name: str) -> str:
        """Delete the note ``name``."""
        if notes.pop(name, None) is None:
            raise Refused(f"no note named {name!r}")
        return f"deleted note {name!r}"

    return server


def make_tasks(num_tasks: int, seed: int) -> list[dict[str, Any]]:
    """``num_tasks`` save-this-note tasks; the same seed always gives the same list."""
    check_num_tasks(num_tasks, none_ok=False)
    rng = random.Random(seed)
    tasks = []
    for _ in range(num_tasks):
        name, text = rng.choice(_NAMES), " ".join(rng.sample(_WORDS, 3))
        prompt = f"Save a note named {name!r} whose text is exactly: {text}"
        tasks.append({"prompt": prompt, "note": name, "text": text})
    return tasks


async def note_saved(env: MCPToolEnv, task: dict[str, Any]) -> float:
    """1 if the store holds the task's note with exactly the task's text (read from the server)."""
    try:
        return float(await env.call_mcp_tool("read_note", {"name": task["note"]}) == task["text"])
    except ToolError:  # the store answered: no such note
        return 0.0


class MCPEnv(MCPToolEnv):
    """Tools from MCP servers; with no ``servers``, save notes in a notes store of ours.

    Args:
        servers: `MCPServer` specs; None: the notes store (`NOTES_SERVER`) with its tasks and
            reward. With servers, give ``tasks`` and a ``rubric`` as for any `ToolEnv`.
        num_tasks: size of the generated notes task list (notes store only).
        seed: seed of the notes task generator (not of episodes).
        kwargs: any `MCPToolEnv` / `ToolEnv` option (``tasks``, ``rubric``, ``max_turns`` ...).
    """

    def __init__(
        self,
        servers: Sequence[MCPServer] | None = None,
        num_tasks: int = 50,
        seed: int = 1234,
        **kwargs: Any,
    ) -> None:
        if servers is None:
            servers = [NOTES_SERVER]
            kwargs.setdefault("tasks", make_tasks(num_tasks, seed))
            kwargs.setdefault("rubric", Rubric([note_saved]))
            kwargs.setdefault("max_turns", 4)
            kwargs.setdefault(
                "system_prompt",
                "You are a careful assistant with a notes store. Use its tools to do what "
                "the user asks, then reply briefly.",
            )
        super().__init__(servers, **kwargs)

    def reference_turns(self, task: dict[str, Any]) -> list[str] | None:
        if "note" not in task:
            return None
        call = ToolCall("write_note", {"name": task["note"], "text": task["text"]})
        return [self.parser.render("", [call]), "Saved."]


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the notes store over stdio, or over streamable HTTP with ``--http PORT``."""
    parser = argparse.ArgumentParser(description="The notes store MCP server of agentgym/MCP-v0.")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on PORT")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP interface (default 127.0.0.1)")
    args = parser.parse_args(argv)
    server = notes_server()
    if args.http is None:
        server.run()
    else:
        server.run("streamable-http", host=args.host, port=args.http)


if __name__ == "__main__":
    main()
