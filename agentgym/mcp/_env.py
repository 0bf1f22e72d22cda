"""`MCPToolEnv`: the rung of the env ladder whose tools are the tools of MCP servers.

    ToolEnv -> MCPToolEnv -> agentgym.envs.mcp.MCPEnv (and any env over MCP servers)

The env lists each server's tools when it is built (once per process and server), offers
them to the model with the servers' own JSON schemas, and, per episode, holds one session
per server: a fresh server process for ``scope="episode"`` specs, the process-wide one for
``scope="shared"``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from agentgym._errors import ConfigError, Forfeit, ToolError
from agentgym._tool_env import ToolEnv
from agentgym._tools import Tool

from ._connection import (
    MCPConnection,
    MCPServerError,
    NoAnswer,
    checkout,
    close_all,
    list_server_tools,
    on_hub,
    on_hub_sync,
)
from ._spec import MCPServer
from ._tools import as_tool, result_text, select


class MCPToolEnv(ToolEnv):
    """A `ToolEnv` whose tools come from MCP servers (stdio or streamable HTTP).

    Args:
        servers: the `MCPServer` specs; each one's ``scope`` says whether an episode gets a
            server process of its own (``"episode"``: started in `setup_episode`, stopped in
            `teardown_episode`, so state never leaks between episodes) or shares one process
            with every episode in this Python process (``"shared"``: for stateless servers).
        tools: local tools offered next to the servers' (functions or `Tool`s).
        kwargs: any `ToolEnv` option (``tasks``, ``rubric``, ``parser``, ``max_turns`` ...)
            except ``tool_timeout``: an MCP call's limit is its server's ``call_timeout``.

    Outcomes: the text (or structured content) of a result becomes the tool message; a result
    with ``isError``, or an error answer of the server, is a tool error the model reads (its
    mistake; the episode goes on). A model's call that crashes its server, or hangs it past
    ``call_timeout``, is the model's doing while a fresh start of the server works (see
    `_call`): with an episode's own stdio server the episode is forfeited (`Forfeit`: it ends
    after the turn with reward 0, since the world it would be scored on went with the
    server); with a ``shared`` or HTTP one it is a tool error and the episode goes on.
    A server that cannot start (at setup, or afresh after such a call) raises
    `MCPServerError`: the episode is ``infra_error``, and the next episode gets a new server.
    Building the env blocks while the servers are first listed.

    Reward functions that ask for ``env`` can read the world's state through the servers with
    `call_mcp_tool` while the episode's sessions are still open (the rubric runs before
    teardown).

    Example::

        env = MCPToolEnv(
            [MCPServer(command=".venv/bin/mcp-server-time", scope="shared")],
            tasks=[{"prompt": "What time is it in Lima?"}],
        )
    """

    def __init__(
        self,
        servers: Sequence[MCPServer],
        *,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        **kwargs: Any,
    ) -> None:
        if "tool_timeout" in kwargs:
            raise ConfigError(
                "MCPToolEnv takes no tool_timeout: set MCPServer(call_timeout=...) instead "
                "(a call that hangs its server is the model's doing while it restarts)"
            )
        self.servers = tuple(servers)
        if not self.servers or not all(isinstance(s, MCPServer) for s in self.servers):
            raise ConfigError(
                f"MCPToolEnv needs servers=[MCPServer(...), ...], got {list(servers)!r}"
            )
        listings = on_hub_sync(_list_all(self.servers))
        mcp_tools: list[Tool] = []
        self._routes: dict[str, tuple[int, str]] = {}  # env tool name -> (server, its name)
        for index, (spec, listed) in enumerate(zip(self.servers, listings)):
            for entry in select(listed, spec):
                tool = as_tool(entry, spec, self._caller(index))
                if tool.name in self._routes:
                    raise ConfigError(
                        f"two MCP servers list a tool named {tool.name!r}; give one of them "
                        "MCPServer(prefix='...') or pick tools with MCPServer(tools=[...])"
                    )
                self._routes[tool.name] = (index, entry.name)
                mcp_tools.append(tool)
        self._connections: list[MCPConnection | None] = [None] * len(self.servers)
        self._replacing = asyncio.Lock()  # made again per episode (a lock binds to one loop)
        super().__init__([*tools, *mcp_tools], **kwargs)

    def _caller(self, index: int) -> Callable[[str, dict[str, Any]], Any]:
        async def call(name: str, arguments: dict[str, Any]) -> str:
            return await self._call(index, name, arguments, by_model=True)

        return call

    async def _call(
        self, index: int, name: str, arguments: dict[str, Any], *, by_model: bool
    ) -> str:
        """One call of a server's tool; one that gets no answer has its server replaced.

        Whose fault the lost answer is, while the fresh server works (`_replace`):

        - an episode's own stdio server took the episode's world with it, and its restart
          starts that world over: scored on that, a model could undo its mistakes by
          crashing the server, or escape a low reward as ``infra_error``. So the episode is
          forfeited (`Forfeit`: it ends with reward 0), whether the model's call or a
          reward's read found the server gone (a server made to die after answering, state
          that hangs a read);
        - a shared server's, or an HTTP server's, world is not the episode's (another
          episode's call may have broken it): the model's call that was sent is its tool
          error; a call that was never sent, or a reward's read, is sent to the fresh one.
        """
        if self._connections[index] is None:
            raise ConfigError("no episode is running; call reset() first")
        if self.state.forfeit is not None and not by_model:
            raise ToolError(f"not read: the episode was forfeited ({self.state.forfeit})")
        spec = self.servers[index]
        for tries_left in (1, 0):
            connection = self._connections[index]
            assert connection is not None  # a teardown cannot run while a step awaits
            try:
                # this env's limit: a shared session may have been opened by another env's spec
                result = await on_hub(connection.call_tool(name, arguments, spec.call_timeout))
                break
            except NoAnswer as failure:
                await self._replace(index, connection, failure)
                if spec.transport == "stdio" and spec.scope == "episode":
                    raise self._forfeit(failure, by_model) from failure
                if (by_model and failure.sent) or not tries_left:
                    restarted = (
                        "the shared server was restarted"
                        if spec.transport == "stdio"
                        else "a new session with the server was opened"
                    )
                    raise ToolError(f"{failure.blamed}; {restarted}") from failure
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or f"{name!r} reported an error")
        return text

    def _forfeit(self, failure: NoAnswer, by_model: bool) -> ToolError:
        """The error that forfeits the episode (see `_call`).

        A reward's read marks the episode here; the model's call through `ToolEnv`, which
        reads the `Forfeit` it raises.
        """
        world_gone = (
            "the episode's world went with the server, so the episode ends here with reward 0"
        )
        if by_model:
            return Forfeit(f"{failure.blamed}; {world_gone}")
        self.state.forfeit = self.state.forfeit or f"a reward's read: {failure}; {world_gone}"
        return ToolError(self.state.forfeit)

    async def _replace(self, index: int, broken: MCPConnection, failure: NoAnswer) -> None:
        """Put a fresh session of server ``index`` in place of ``broken``.

        Why: the model chooses a call's arguments, and some crash or hang a server; were that
        `MCPServerError`, the episode would be ``infra_error``, dropped rather than scored, and
        a model could escape a low reward by breaking its server. So a request that got no
        answer is blamed on whoever shaped it while the same server, started afresh, answers a
        plain request (`checkout` with ``replacing``); only when it does not is ``failure``
        infrastructure. Later calls go to the fresh one (a shared server's other episodes, the
        rest of a turn). Calls that failed together (parallel calls of a turn) share one.
        """
        async with self._replacing:
            current = self._connections[index]
            if current is not broken and current is not None:
                return  # a call that failed with it has replaced it already
            try:
                fresh = await checkout(self.servers[index], replacing=broken)
            except MCPServerError as exc:
                raise MCPServerError(f"{failure}; starting it afresh failed too: {exc}") from exc
            self._connections[index] = fresh

    async def call_mcp_tool(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        """Call a tool of this episode's servers by its env name; for reward functions.

        Returns the result's text; raises `ToolError` when the server reports an error, or
        gets no answer while the server works when started afresh (`_call`: an episode's own
        server then forfeits the episode), and `MCPServerError` when the server failed
        whoever asks. Arguments are not validated: the caller is the env's author.
        """
        if name not in self._routes:
            raise ConfigError(f"no MCP tool named {name!r}; this env has {sorted(self._routes)}")
        index, server_name = self._routes[name]
        return await self._call(index, server_name, arguments or {}, by_model=False)

    async def setup_episode(self, task: dict[str, Any]) -> None:
        """Open this episode's sessions: new servers for ``episode`` scope, else the shared."""
        await super().setup_episode(task)
        self._replacing = asyncio.Lock()
        for index, spec in enumerate(self.servers):
            self._connections[index] = await checkout(spec)

    async def teardown_episode(self) -> None:
        """Stop this episode's own servers; returns when they are gone.

        Runs on every way out of an episode, a cancelled one included; the servers stop even
        if this await is cancelled again (the stop runs on, on the MCP loop).
        """
        own = [
            c for c, spec in zip(self._connections, self.servers)
            if c is not None and spec.scope == "episode"
        ]  # fmt: skip
        self._connections = [None] * len(self.servers)
        try:
            if own:
                await asyncio.shield(on_hub(close_all(own)))
        finally:
            await super().teardown_episode()


async def _list_all(servers: Sequence[MCPServer]) -> list[list[Any]]:
    return list(await asyncio.gather(*(list_server_tools(spec) for spec in servers)))
