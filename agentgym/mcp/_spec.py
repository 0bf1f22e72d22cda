"""`MCPServer`: what to run (or where to connect) for one MCP server, checked up front."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentgym._errors import ConfigError

Transport = Literal["stdio", "http"]
Scope = Literal["episode", "shared"]


@dataclass(frozen=True)
class MCPServer:
    """One MCP server whose tools an `MCPToolEnv` offers the model.

    Args:
        command: the executable of a stdio server (looked up on ``PATH``), e.g.
            ``".venv/bin/mcp-server-time"`` or ``sys.executable``.
        args: its command-line arguments.
        env: extra environment variables for it (over the MCP SDK's safe defaults: ``PATH``,
            ``HOME`` ...; the rest of this process's environment is not passed on).
        cwd: its working directory; None: this process's.
        url: the endpoint of a streamable HTTP server, e.g. ``"http://127.0.0.1:8000/mcp"``.
            Give ``command`` or ``url``, not both.
        transport: ``"stdio"`` or ``"http"``; None: ``"stdio"`` with a command, ``"http"``
            with a url.
        scope: ``"episode"``: a fresh process and session per episode, started in
            `MCPToolEnv.setup_episode` and stopped in ``teardown_episode``, so no state leaks
            from one episode to the next (an HTTP server is not ours to start: only its session
            is per episode). ``"shared"``: one process and session for every episode of every
            env in this Python process with an equal spec, for stateless servers; it starts
            with the first env and is restarted by the next episode after it died or hung.
        tools: offer only these tools (by the server's names); None: every tool it lists.
        prefix: prepended to each tool's name, so two servers may both have a ``search``.
        start_timeout: seconds to start the server and finish the MCP handshake.
        call_timeout: seconds a tool call may take; past it the episode is ``infra_error``
            (a hung server is the machinery's failure, not the model's mistake).

    Example::

        MCPServer(command=".venv/bin/mcp-server-time", scope="shared")
        MCPServer(url="http://127.0.0.1:8000/mcp", prefix="notes_")
    """

    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    transport: Transport | None = None
    scope: Scope = "episode"
    tools: Sequence[str] | None = None
    prefix: str = ""
    start_timeout: float = 30.0
    call_timeout: float = 60.0

    def __post_init__(self) -> None:
        # frozen: normalise through object.__setattr__ so equal specs hash alike
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", dict(self.env))
        if self.tools is not None:
            object.__setattr__(self, "tools", tuple(self.tools))
        if self.transport is None:
            object.__setattr__(self, "transport", "http" if self.url else "stdio")
        self._check()

    def _check(self) -> None:
        if self.transport not in ("stdio", "http"):
            raise ConfigError(
                f"MCPServer transport must be 'stdio' or 'http', got {self.transport!r}"
            )
        if self.command is not None and self.url is not None:
            raise ConfigError(
                f"MCPServer got both command={self.command!r} and url={self.url!r}; "
                "give one: a command for stdio, a url for http"
            )
        if self.transport == "stdio":
            if not self.command:
                raise ConfigError(
                    "MCPServer with transport 'stdio' needs command=..., the server's "
                    "executable (e.g. command=sys.executable, args=['server.py'])"
                )
            if shutil.which(self.command) is None:
                raise ConfigError(
                    f"MCPServer command {self.command!r} is not an executable file or on PATH; "
                    "give its full path"
                )
        elif not (self.url or "").startswith(("http://", "https://")):
            raise ConfigError(
                "MCPServer with transport 'http' needs url='http://HOST:PORT/mcp', "
                f"got url={self.url!r}"
            )
        if self.scope not in ("episode", "shared"):
            raise ConfigError(f"MCPServer scope must be 'episode' or 'shared', got {self.scope!r}")
        for name in ("start_timeout", "call_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"MCPServer {name} must be > 0 seconds, got {value!r}")

    @property
    def label(self) -> str:
        """How errors name this server: its url, or its command line."""
        return self.url or " ".join([self.command or "", *self.args])

    def __hash__(self) -> int:
        return hash(self.key())

    def key(self) -> tuple[object, ...]:
        """What makes two specs the same server (the shared-process registry's key)."""
        return (self.transport, self.command, self.args, tuple(sorted(self.env.items())),
                self.cwd, self.url)  # fmt: skip
