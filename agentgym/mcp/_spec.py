"""`MCPServer`: what to run (or where to connect) for one MCP server, checked up front."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentgym._errors import ConfigError

Transport = Literal["stdio", "http"]
Scope = Literal["episode", "shared"]
#: Replaced by the path of the episode's copy of `MCPServer.workspace`.
WORKSPACE = "{workspace}"
#: What a tool name may start with (names allow these characters, 64 at most).
_PREFIX = re.compile(r"^[a-zA-Z0-9_-]{1,48}$")


@dataclass(frozen=True)
class MCPServer:
    """One MCP server whose tools an `MCPToolEnv` offers the model.

    Args:
        command: the executable of a stdio server (looked up on ``PATH``), e.g.
            ``".venv/bin/mcp-server-time"`` or ``sys.executable``.
        args: its command-line arguments.
        env: extra environment variables for it (over the MCP SDK's safe defaults: ``PATH``,
            ``HOME`` ...; the rest of this process's environment is not passed on).
        cwd: its working directory; None: this process's (the workspace copy's, with one).
        url: the endpoint of a streamable HTTP server, e.g. ``"http://127.0.0.1:8000/mcp"``.
            Give ``command`` or ``url``, not both.
        transport: ``"stdio"`` or ``"http"``; None: ``"stdio"`` with a command, ``"http"``
            with a url.
        scope: ``"episode"``: a fresh process and session per episode, started in
            `MCPToolEnv.setup_episode` and stopped in ``teardown_episode``, so no state leaks
            from one episode to the next in the process (state a server keeps on disk needs a
            ``workspace``; an HTTP server is not ours to start: only its session is per
            episode). ``"shared"``: one process and session for every episode of every
            env in this Python process with an equal spec, for stateless servers; it starts
            with the first env and is restarted by the next episode after it died or hung.
        workspace: a folder copied afresh for every start of an ``"episode"`` stdio server,
            for servers that keep state on disk (a git repository, a database file): a new
            process alone would reopen the same files, and what one episode wrote would be
            there for the next, and for the other episodes of its group. The server runs in
            the copy (unless ``cwd`` is given), ``{workspace}`` in ``args``, ``env`` values and
            ``cwd`` is replaced by the copy's path, and the copy is removed when the server
            stops. None: no copy.
        tools: offer only these tools (by the server's names); None: every tool it lists.
        prefix: prepended to each tool's name, so two servers may both have a ``search``.
        start_timeout: seconds to start the server and finish the MCP handshake.
        call_timeout: seconds a tool call may take; past it the server is restarted and the
            call is the model's doing while the restarted server answers (an episode's own
            server: the episode is forfeited, reward 0; else a tool error), ``infra_error``
            when it does not. Each env's calls run under its own spec's limit, a shared
            server's too.
        stderr: where a stdio server's stderr (its logs, its tracebacks) goes. None: appended
            to a log file of this process and server, ``agentgym-logs/mcp-PID-NAME.log`` in the
            temp folder (`log_path` names it; a start failure quotes its last lines and names
            it); a path: appended to that file; ``"inherit"``: this process's stderr (the
            terminal); ``"discard"``: nowhere.

    Example::

        MCPServer(command=".venv/bin/mcp-server-time", scope="shared")
        MCPServer(url="http://127.0.0.1:8000/mcp", prefix="notes_")
        # a repo per episode; --repository keeps the model's git calls in that copy (without
        # it a call naming the template's path would commit there)
        MCPServer(command="mcp-server-git", args=["--repository", "{workspace}"],
                  workspace="fixtures/repo")
    """

    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    transport: Transport | None = None
    scope: Scope = "episode"
    workspace: str | None = None
    tools: Sequence[str] | None = None
    prefix: str = ""
    start_timeout: float = 30.0
    call_timeout: float = 60.0
    stderr: str | None = None

    def __post_init__(self) -> None:
        # a lone string would be split into characters: one argument or tool per letter
        for name, example in (("args", "args=['server.py']"), ("tools", "tools=['search']")):
            if isinstance(getattr(self, name), str | bytes):
                raise ConfigError(
                    f"MCPServer {name} must be a list of strings, got the string "
                    f"{getattr(self, name)!r}; write {example}"
                )
        # frozen: normalise through object.__setattr__ so equal specs hash alike. A path is
        # taken as its text; anything else that is not a string (an int) is refused here: it
        # used to fail only in the SDK, silently, and the start waited out start_timeout
        for name in ("command", "cwd", "workspace", "stderr"):
            object.__setattr__(self, name, _text(getattr(self, name), name, none_ok=True))
        object.__setattr__(
            self, "args", tuple(_text(a, f"args[{i}]") for i, a in enumerate(self.args))
        )
        if not isinstance(self.env, Mapping):
            raise ConfigError(f"MCPServer env must be a dict of strings, got {self.env!r}")
        env = {}
        for key, value in self.env.items():
            if not isinstance(key, str):
                raise ConfigError(f"MCPServer env keys must be strings, got {key!r}")
            env[key] = _text(value, f"env[{key!r}]")
        object.__setattr__(self, "env", env)
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
            found = shutil.which(self.command)
            if found is None:
                raise ConfigError(_not_found(self.command))
            # a relative command is found from here; the server may start in another cwd
            object.__setattr__(self, "command", os.path.abspath(found))
        elif not (self.url or "").startswith(("http://", "https://")):
            raise ConfigError(
                "MCPServer with transport 'http' needs url='http://HOST:PORT/mcp', "
                f"got url={self.url!r}"
            )
        if self.scope not in ("episode", "shared"):
            raise ConfigError(f"MCPServer scope must be 'episode' or 'shared', got {self.scope!r}")
        if self.prefix and not _PREFIX.match(self.prefix):
            # tool names allow letters, digits, '_' and '-' (64 at most): "time." made every
            # tool a name the model's API refuses, and only `agentgym check` said so
            raise ConfigError(
                f"MCPServer prefix {self.prefix!r} may hold only letters, digits, '_' and '-' "
                "(it starts every tool's name); e.g. prefix='time_'"
            )
        if self.workspace is not None:
            self._check_workspace()
        for name in ("start_timeout", "call_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"MCPServer {name} must be > 0 seconds, got {value!r}")
        if self.stderr is not None and self.transport != "stdio":
            raise ConfigError(
                "MCPServer stderr= is for a stdio server this process starts; an HTTP "
                "server's stderr is not ours"
            )
        if self.stderr not in (None, "inherit", "discard"):
            folder = os.path.dirname(os.path.abspath(self.stderr or ""))
            if not os.path.isdir(folder):
                raise ConfigError(
                    f"MCPServer stderr={self.stderr!r}: its folder {folder!r} does not exist; "
                    "give a file in an existing folder, 'inherit' or 'discard'"
                )
            object.__setattr__(self, "stderr", os.path.abspath(self.stderr or ""))

    def _check_workspace(self) -> None:
        if self.scope != "episode" or self.transport != "stdio":
            raise ConfigError(
                "MCPServer workspace= copies a folder for each episode's own server process: "
                "it needs scope='episode' and a stdio command (an HTTP server is not ours to "
                "start)"
            )
        if not os.path.isdir(self.workspace or ""):
            raise ConfigError(
                f"MCPServer workspace {self.workspace!r} is not a folder; give the folder to "
                "copy for each episode"
            )
        object.__setattr__(self, "workspace", os.path.abspath(self.workspace or ""))

    def in_workspace(self, copy: str) -> MCPServer:
        """The spec as started in ``copy`` (a fresh copy of `workspace`): no copy to make."""
        def fill(text: str) -> str:
            return text.replace(WORKSPACE, copy)

        return dataclasses.replace(
            self,
            args=[fill(a) for a in self.args],
            env={k: fill(v) for k, v in self.env.items()},
            cwd=copy if self.cwd is None else fill(self.cwd),
            workspace=None,
        )

    @property
    def label(self) -> str:
        """How errors name this server: its url, or its command line."""
        return self.url or " ".join([self.command or "", *self.args])

    @property
    def log_path(self) -> str | None:
        """The file this server's stderr is appended to; None: none (``inherit``/``discard``).

        By default (``stderr=None``) a file of this process and server in the temp folder,
        ``agentgym-logs/mcp-PID-NAME.log``, which every start of the server appends to. An
        empty one is deleted at exit, or, if this process is killed, by the next process's
        first server; one that holds something stays (it may tell why a server failed).
        """
        if self.transport != "stdio" or self.stderr in ("inherit", "discard"):
            return None
        if self.stderr is not None:
            return self.stderr
        words = [os.path.basename(w) for w in [self.command or "", *self.args][:3]]
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(words))[:60].strip("-.")
        digest = hashlib.sha1(repr(self.key()).encode()).hexdigest()[:8]
        folder = os.path.join(tempfile.gettempdir(), "agentgym-logs")
        return os.path.join(folder, f"mcp-{os.getpid()}-{name}-{digest}.log")

    def __hash__(self) -> int:
        return hash(self.key())

    def key(self) -> tuple[object, ...]:
        """What makes two specs the same server (the shared-process registry's key).

        The timeouts, ``scope``, ``tools``, ``prefix`` and ``stderr`` are not in it: envs
        whose specs differ only there share one server (``stderr``: the first start's), and
        each env times its own calls with its own ``call_timeout``.
        """
        return (self.transport, self.command, self.args, tuple(sorted(self.env.items())),
                self.cwd, self.url, self.workspace)  # fmt: skip


def _text(value: object, name: str, none_ok: bool = False) -> str | None:
    """``value`` as a string: a path's text; a `ConfigError` naming ``name`` for anything else."""
    if value is None and none_ok:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ConfigError(
            f"MCPServer {name} must be a string, got {type(value).__name__} {value!r}; "
            f"write str({value!r})"
        )
    return value


def _not_found(command: str) -> str:
    """Why ``command`` cannot be run; a whole command line is told to split itself."""
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote
        words = command.split()
    if len(words) > 1 and shutil.which(words[0]) is not None:
        return (
            f"MCPServer command {command!r} is a whole command line, not an executable: give "
            f"command={words[0]!r}, args={words[1:]!r}"
        )
    return f"MCPServer command {command!r} is not an executable file or on PATH; give its full path"
