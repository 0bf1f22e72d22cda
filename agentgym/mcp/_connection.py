"""Live MCP sessions, all owned by one background event loop of this process (the hub).

Why a loop of our own: an MCP session (the SDK's anyio task group, a stdio server's pipes)
belongs to the loop that opened it and must be closed by the task that opened it, while envs
are built in a sync ``__init__`` (where their tools are listed) and stepped on whatever loop
plays them (the rollout's, a thread's sync-adapter loop). So each session lives in an owner
task on the hub loop; episodes submit calls there and await the answers from their own loop.
Cancelling an episode cancels its call on the hub; closing a session stops its owner task,
whose exit ends the session and the server process (the SDK bounds every wait of that, and
a close keeps going on the hub even when whoever asked for it is cancelled).

What fails how: a server that cannot start raises `MCPServerError` (an `InfraError`: the
episode is ``infra_error``). A request that gets no answer (the server dies during it, or
does not answer within its ``call_timeout``) raises `NoAnswer`, an `MCPServerError`, and
marks the session broken, so it is never used again. Whose fault that is depends on who
shaped the request, so the caller decides: the model's arguments can crash or hang a server,
so `MCPToolEnv` replaces the session (`checkout` with ``replacing``: a fresh server that must
answer a plain request) and blames the episode while the fresh server works (see
`MCPToolEnv._blame`); only a server that cannot be started afresh is infrastructure. A server
that *answers* with an error (an ``isError`` result, a JSON-RPC error such as an unknown tool
or bad arguments) answered the model's call: that is the model's mistake, a `ToolError`.
A tool listing that only fixing the server mends (see `_list_all_pages`) is a `ConfigError`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import functools
import os
import shutil
import sys
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from agentgym import _owned_tmp
from agentgym._errors import ConfigError, InfraError, ToolError
from agentgym._pid import process_alive
from agentgym._run_to_end import run_to_end

from ._spec import MCPServer

if TYPE_CHECKING:
    import mcp
    import mcp_types

_T = TypeVar("_T")


class MCPServerError(InfraError):
    """An MCP server could not start, or failed whoever asked: ``infra_error``.

    ``exit_status``: a stdio server that exited on its own before the MCP handshake, its exit
    status; else None.
    """

    exit_status: int | None = None


class NoAnswer(MCPServerError):
    """A request got no answer: the server died or hung during it, or had died before it.

    Raised as infrastructure; a caller whose request the model shaped blames the model
    instead when a fresh server works (see `MCPToolEnv`), with `blamed`, what the call did in
    the model's terms, as the tool message. ``sent`` is False when the server had stopped
    before the request (another request broke it): the request itself did nothing.
    """

    def __init__(self, spec: MCPServer, failure: str, blamed: str, sent: bool = True) -> None:
        super().__init__(f"MCP server {spec.label!r} {failure}")
        self.blamed, self.sent = blamed, sent


# ---- the hub loop ---------------------------------------------------------------------------


class _Hub:
    """A daemon thread running the event loop every MCP session of the process lives on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name="agentgym-mcp", daemon=True)
        thread.start()


_hub: _Hub | None = None
_hub_lock = threading.Lock()
if hasattr(os, "register_at_fork"):  # a forked child has no hub thread: start its own

    def _forget_hub() -> None:
        global _hub
        _hub = None
        _shared.clear()  # the parent's sessions: their loop and pipes are not this child's
        _shared_locks.clear()
        _live.clear()
        _starting.clear()
        _failed_starts.clear()

    os.register_at_fork(after_in_child=_forget_hub)


def _submit(coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = _Hub()
        loop = _hub.loop
    return asyncio.run_coroutine_threadsafe(coro, loop)


async def on_hub(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` on the hub loop and await its result here; cancelling this cancels it."""
    return await asyncio.wrap_future(_submit(coro))


def on_hub_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` on the hub loop and block until it is done (for sync callers)."""
    return _submit(coro).result()


# ---- one session ----------------------------------------------------------------------------


def _import_mcp() -> Any:
    try:
        import mcp
    except ImportError as exc:
        raise ConfigError(
            f"agentgym.mcp needs the MCP SDK ({exc}); install it: pip install 'agentgym[tools]'"
        ) from exc
    return mcp


def _innermost(exc: BaseException) -> BaseException:
    """The exception inside the (nested, one-member) exception groups anyio raises."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside the exception groups anyio raises."""
    exc = _innermost(exc)
    return f"{type(exc).__name__}: {exc}"


def _start_failure(exc: BaseException, spec: MCPServer) -> str:
    """Why a server did not start, after its name: unreachable, or failed.

    An unreachable url is named as such, so nobody debugs a server that is not there; a url
    that answers "Not Found" and does not end in ``/mcp`` is told where such servers serve.
    """
    import httpx2  # the SDK's HTTP client: installed with it

    reason = _describe(exc)
    if isinstance(_innermost(exc), httpx2.ConnectError):
        return f"could not be reached ({reason})"
    if spec.url and "not found" in reason.lower() and not spec.url.rstrip("/").endswith("/mcp"):
        parts = urllib.parse.urlsplit(spec.url)
        return (
            f"failed to start: {reason}; streamable HTTP servers usually serve at /mcp: "
            f"try url={parts.scheme + '://' + parts.netloc + '/mcp'!r}"
        )
    return f"failed to start: {reason}"


#: Lines of a server's stderr a start failure quotes (their last ones), and characters at most.
STDERR_TAIL_LINES, STDERR_TAIL_CHARS = 5, 1000


def _stderr_tail(path: str | None, offset: int) -> str:
    """The last lines the server wrote to ``path`` after ``offset``, on one line; "" if none."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as log:
            log.seek(max(offset, os.path.getsize(path) - 64 * 1024))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    tail = " | ".join(lines[-STDERR_TAIL_LINES:])
    return tail if len(tail) <= STDERR_TAIL_CHARS else "..." + tail[-STDERR_TAIL_CHARS:]


def _open_stderr(spec: MCPServer, path: str | None) -> tuple[TextIO, int]:
    """The file a stdio server's stderr goes to, and where this start's output begins there."""
    if spec.stderr == "inherit":
        return sys.stderr, 0  # the SDK's default
    if path is None:  # discard
        return open(os.devnull, "w"), 0  # noqa: SIM115 (closed by the owner task)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    log = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by the owner task)
    return log, log.tell()


#: Where the owner task's stdio transport puts the server process it starts (see `_spawns`).
_spawned: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "agentgym_mcp_spawned", default=None
)


@functools.cache
def _spawns() -> None:
    """Let the owner task see its server's process (for its exit status), once per process.

    The SDK's stdio transport does not expose the process; its spawn function is wrapped so
    that a task that set `_spawned` gets it. Without that function (another SDK version) the
    exit status is not known, and nothing else changes.
    """
    from mcp.client import stdio

    spawn = getattr(stdio, "_create_platform_compatible_process", None)
    if spawn is None:
        return

    async def spawn_and_tell(*args: Any, **kwargs: Any) -> Any:
        process = await spawn(*args, **kwargs)
        sink = _spawned.get()
        if sink is not None:
            sink.append(process)
        return process

    stdio._create_platform_compatible_process = spawn_and_tell


#: Run before a stdio server on Linux: it then gets SIGKILL when this process dies, however it
#: dies (the SDK starts servers in a session of their own, so nothing else reaches them after
#: a SIGTERM or SIGKILL of ours). argv: our pid, the server's command and args.
_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: it survives the exec\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)  # the parent died already\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _dies_with_us(command: str, args: list[str]) -> tuple[str, list[str]]:
    """``command`` and ``args`` run so that the server dies with this process (Linux)."""
    if not sys.platform.startswith("linux") or not sys.executable:
        return command, args
    return sys.executable, ["-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), command, *args]


#: How the workspace copies are named (`agentgym._owned_tmp` adds the owner's pid): the next
#: process that copies a workspace removes those of a process killed with them still there.
WORKSPACE_PREFIX = "agentgym-mcp-"


def _fill_workspace(template: str, copy: str) -> None:
    """Copy ``template`` into ``copy`` (run in a worker thread: see `MCPConnection._open`)."""
    try:
        shutil.copytree(template, copy, dirs_exist_ok=True)  # links copied as files: none out
    except OSError as exc:
        raise MCPServerError(f"could not copy the MCP workspace {template!r}: {exc}") from exc


class MCPConnection:
    """One MCP session with one server; its coroutines run on the hub loop (`on_hub`)."""

    def __init__(self, spec: MCPServer) -> None:
        self.spec = spec
        #: This server's copy of ``spec.workspace`` (removed by `close`); None without one.
        self.workspace: str | None = None
        #: True once the server died, hung, or the session was closed: never use it again.
        self.broken = False
        self._client: mcp.Client | None = None
        self._stop = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None
        self._closing: asyncio.Future[None] | None = None  # the one close (see `close`)
        #: Where the server's stderr goes (a file), or None (see `MCPServer.log_path`), and
        #: where this start's output begins in it.
        self.log_path = None if spec.stderr == "inherit" else spec.log_path
        self.stderr_offset = 0
        if self.log_path is not None and spec.stderr is None:
            _logs.add(self.log_path)

    @classmethod
    async def open(cls, spec: MCPServer) -> MCPConnection:
        """Start the server (stdio) or connect (http) and finish the MCP handshake.

        At most `MAX_STARTING` stdio servers start at once (the rest wait their turn, and
        ``start_timeout`` counts from their turn): a batch of episodes starting a server each
        would otherwise share the CPUs until none finishes within its ``start_timeout``, and
        every episode would be ``infra_error`` for a load of our own making.
        """
        mcp = _import_mcp()
        if spec.transport != "stdio":
            return await cls._open(mcp, spec)
        async with _start_slots():
            return await cls._open(mcp, spec)

    @classmethod
    async def _open(cls, mcp: Any, spec: MCPServer) -> MCPConnection:
        connection = cls(spec)
        _live.add(connection)
        _close_at_exit()
        ready = asyncio.get_running_loop().create_future()
        try:
            if connection.log_path is not None and spec.stderr is None:  # off the hub loop
                await asyncio.to_thread(_sweep_empty_logs, os.path.dirname(connection.log_path))
            if spec.workspace is not None:
                # in a worker thread: copied on the hub loop, a big workspace froze every MCP
                # session of the process, and their calls timed out (forfeits nobody caused).
                # The copy's folder is the connection's before the await, and a cancelled
                # start waits for the copy to end (`run_to_end`), so `close` removes all of it
                await run_to_end(asyncio.to_thread(_owned_tmp.sweep_once, WORKSPACE_PREFIX))
                connection.workspace = str(_owned_tmp.make_dir(WORKSPACE_PREFIX))
                await run_to_end(
                    asyncio.to_thread(_fill_workspace, spec.workspace, connection.workspace)
                )
                connection.spec = spec.in_workspace(connection.workspace)
            connection._owner = asyncio.create_task(connection._own(mcp, ready))
            async with asyncio.timeout(spec.start_timeout):
                await ready
        except TimeoutError:
            await connection.close()
            tail = _stderr_tail(connection.log_path, connection.stderr_offset)
            raise MCPServerError(
                f"MCP server {spec.label!r} did not start within {spec.start_timeout:g} s"
                + (f"; its stderr ended: {tail} (all of it: {connection.log_path})" if tail else "")
            ) from None
        except BaseException:
            await connection.close()
            raise
        return connection

    async def _own(self, mcp: Any, ready: asyncio.Future[None]) -> None:
        """The owner task: open the session, hold it until `close`, then end it.

        Anything that fails before the session is open (the server's parameters included)
        fails the start at once, with the server's exit status and last stderr lines.
        """
        spec, errlog, offset = self.spec, None, 0
        processes: list[Any] = []
        try:
            if spec.url:
                target: Any = spec.url
            else:
                from mcp.client.stdio import stdio_client

                _spawns()
                _spawned.set(processes)
                errlog, offset = _open_stderr(spec, self.log_path)
                self.stderr_offset = offset
                command, args = _dies_with_us(spec.command or "", list(spec.args))
                parameters = mcp.StdioServerParameters(
                    command=command, args=args, env=dict(spec.env) or None, cwd=spec.cwd
                )
                target = stdio_client(parameters, errlog=errlog)
            async with mcp.Client(target) as client:
                self._client = client
                if not ready.done():  # else `open` gave up waiting and is closing this
                    ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # a session that ends on its own ends quietly
            if not ready.done():
                status = getattr(processes[0], "returncode", None) if processes else None
                ready.set_exception(self._start_error(exc, status, offset))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._client, self.broken = None, True
            if errlog is not None and errlog is not sys.stderr:
                errlog.close()

    def _start_error(self, exc: BaseException, status: int | None, offset: int) -> MCPServerError:
        """The error of a start that failed with ``exc`` (the server's exit ``status``)."""
        spec = self.spec
        parts = [_start_failure(exc, spec)]
        if status is not None and status >= 0:  # it ended on its own (killed by us: < 0)
            parts.append(f"it exited with status {status} before the MCP handshake")
        else:
            status = None
        if tail := _stderr_tail(self.log_path, offset):  # starts beside it append there too
            parts.append(f"its stderr ended: {tail} (the log of this server's starts: "
                         f"{self.log_path})")  # fmt: skip
        if status:
            parts.append("check command, args, env and cwd")
        error = MCPServerError(f"MCP server {spec.label!r} {'; '.join(parts)}")
        error.exit_status = status
        return error

    async def close(self) -> None:
        """End the session and stop the server; returns when both are gone.

        The first call closes, and that close goes on when its caller is cancelled; every call
        waits for it. Closing again would cancel a starting owner task a second time, which
        breaks into the SDK's shielded shutdown: that never ends (at exit, the process hung)
        and the server and its workspace copy are left behind.
        """
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        """The close every `close` waits for."""
        self.broken = True
        self._stop.set()
        owner = self._owner
        if owner is not None:
            if self._client is None:  # still starting: nothing to stop cleanly
                owner.cancel()
            await asyncio.wait([owner])
        if self.workspace is not None:  # the server is gone: nothing writes there any more
            copy, self.workspace = self.workspace, None
            try:
                await asyncio.to_thread(_owned_tmp.remove, Path(copy))
            except RuntimeError:  # the interpreter is exiting: no new threads, remove it here
                _owned_tmp.remove(Path(copy))
        _live.discard(self)

    async def list_tools(self, timeout: float | None = None) -> list[mcp_types.Tool]:
        """Every tool the server lists, all pages, within one ``call_timeout`` in all.

        Raises `ConfigError` for a listing no retry can fix (see `_list_all_pages`).
        """
        listing = functools.partial(_list_all_pages, label=self.spec.label)
        return await self._request("the listing of its tools", listing, timeout)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], timeout: float | None = None
    ) -> mcp_types.CallToolResult:
        """One ``tools/call`` within ``timeout`` seconds (None: the spec's ``call_timeout``).

        An answer with ``isError`` is returned, not raised. A shared session serves envs with
        different limits: each passes its own.
        """
        send = functools.partial(_call_tool, name=name, arguments=arguments)
        what = f"the call of {name!r}"
        result: mcp_types.CallToolResult = await self._request(what, send, timeout)
        return result

    async def _request(
        self,
        what: str,
        send: Callable[[mcp.Client], Awaitable[_T]],
        timeout: float | None = None,
    ) -> _T:
        """Send one request under ``timeout`` (None: ``call_timeout``); sort its failures."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        spec, client = self.spec, self._client
        limit = spec.call_timeout if timeout is None else timeout
        if client is None or self.broken:
            stopped = f"the MCP server had stopped before {what}, so it did not run"
            raise NoAnswer(spec, "is not running (it died or hung)", stopped, sent=False)
        scope = asyncio.timeout(limit)
        try:
            async with scope:
                return await send(client)
        except MCPError as exc:
            if exc.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                raise ToolError(exc.message) from exc  # the server answered the model's call
            failure: Exception = exc
        except ConfigError:
            raise  # the server answered, with what only fixing the server mends
        except Exception as exc:
            failure = exc
        self.broken = True
        if scope.expired():
            seconds = f"{limit:g} s"
            raise NoAnswer(spec, f"did not answer {what} within {seconds}",
                           f"{what} did not finish within {seconds}") from None  # fmt: skip
        reason = _describe(failure)
        raise NoAnswer(spec, f"failed during {what}: {reason}",
                       f"{what} crashed the MCP server ({reason})") from failure  # fmt: skip

    async def probe(self, timeout: float | None = None) -> None:
        """Whether the server answers: asks for its tools (one page, not the SDK's cache).

        Raises `MCPServerError` when it gets no answer within ``timeout`` (None:
        ``call_timeout``).
        """
        listing = functools.partial(_list_page, cursor=None)
        await self._request("a listing of its tools", listing, timeout)


async def _list_page(client: mcp.Client, cursor: str | None) -> mcp_types.ListToolsResult:
    return await client.list_tools(cursor=cursor, cache_mode="bypass")  # ask the server itself


#: Pages of one tool listing at most: a server whose cursors never end would be asked for ever.
MAX_TOOL_PAGES = 100


async def _list_all_pages(client: mcp.Client, label: str) -> list[mcp_types.Tool]:
    """Every page of the server's tool listing.

    The server answered, badly, when the SDK rejects a page (a tool without ``inputSchema``,
    one whose type is not "object"), a cursor comes back again, or the pages go on past
    `MAX_TOOL_PAGES` (building the env hung while its memory grew): a `ConfigError`.
    """
    from pydantic import ValidationError

    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(MAX_TOOL_PAGES):
        try:
            page = await _list_page(client, cursor)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"]))
            more = f" and {exc.error_count() - 1} more" if exc.error_count() > 1 else ""
            raise ConfigError(
                f"MCP server {label!r} lists tools the MCP SDK rejects ({where}: "
                f"{first['msg']}{more}); fix the server (the SDK refuses the whole listing, so "
                "MCPServer(tools=[...]) cannot leave the tool out)"
            ) from exc
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
        if cursor in seen:
            raise ConfigError(
                f"MCP server {label!r} repeats the cursor {cursor!r} when listing its tools, "
                "so the listing never ends; fix the server"
            )
        seen.add(cursor)
    raise ConfigError(
        f"MCP server {label!r} lists its tools in more than {MAX_TOOL_PAGES} pages "
        "(agentgym.mcp._connection.MAX_TOOL_PAGES); fix the server"
    )


async def _call_tool(
    client: mcp.Client, name: str, arguments: dict[str, Any]
) -> mcp_types.CallToolResult:
    return await client.call_tool(name, arguments)


# ---- the process's shared servers and tool listings (touched only on the hub loop) ----------

_shared: dict[tuple[object, ...], MCPConnection] = {}
_shared_locks: dict[tuple[object, ...], asyncio.Lock] = {}
_listings: dict[tuple[object, ...], list[Any]] = {}
#: The last failed start of each shared server: (when it failed, its error); see `connect`.
_failed_starts: dict[tuple[object, ...], tuple[float, MCPServerError]] = {}
#: Seconds after a shared server failed to start in which no episode starts it again.
SHARED_RETRY_SECONDS = 10.0
#: The default stderr logs of this process's servers (`MCPServer.log_path`): empty ones are
#: removed at exit.
_logs: set[str] = set()
#: Every session opened and not yet closed (episode-scoped ones too): closed at exit.
_live: set[MCPConnection] = set()
#: How many stdio servers may be starting at once (see `MCPConnection.open`).
MAX_STARTING = max(2, os.cpu_count() or 1)
_starting: list[asyncio.Semaphore] = []  # made on the hub loop, once


def _start_slots() -> asyncio.Semaphore:
    if not _starting:
        _starting.append(asyncio.Semaphore(MAX_STARTING))
    return _starting[0]


async def connect(spec: MCPServer) -> MCPConnection:
    """A session for one episode: a new one (scope ``episode``) or the shared one.

    The shared session of a spec is started by the first caller, and started again by the
    first caller after it broke (its server died or hung). A start that failed is not tried
    again by the callers that queued behind it, nor for `SHARED_RETRY_SECONDS` after it: they
    raise its error at once. Each used to wait its turn and then its own ``start_timeout``,
    so a group of 64 episodes took 64 start timeouts to end ``infra_error``.
    """
    if spec.scope == "episode":
        return await MCPConnection.open(spec)
    key, asked = spec.key(), time.monotonic()
    async with _shared_locks.setdefault(key, asyncio.Lock()):
        connection = _shared.get(key)
        if connection is None or connection.broken:
            failed = _failed_starts.get(key)
            if failed is not None and (
                failed[0] >= asked or time.monotonic() - failed[0] < SHARED_RETRY_SECONDS
            ):
                error = MCPServerError(
                    f"{failed[1]} (a start of this shared server failed "
                    f"{time.monotonic() - failed[0]:.0f} s ago; it is tried again "
                    f"{SHARED_RETRY_SECONDS:g} s after that)"
                )
                error.exit_status = failed[1].exit_status
                raise error
            if connection is not None:
                await connection.close()
            _close_at_exit()
            try:
                connection = _shared[key] = await MCPConnection.open(spec)
            except MCPServerError as exc:
                _failed_starts[key] = (time.monotonic(), exc)
                raise
            _failed_starts.pop(key, None)
        return connection


async def reconnect(spec: MCPServer, broken: MCPConnection) -> MCPConnection:
    """Close ``broken`` (a session of ``spec`` that gave no answer) and `connect` afresh.

    The new session must answer a plain request (`MCPConnection.probe`) too: that tells a
    server that works, which a request only broke, from one that fails whoever asks. A shared
    session may already have been replaced by another episode: that replacement is probed.
    Raises `MCPServerError` when the server cannot start or answer; nothing is left running.
    """
    await broken.close()
    connection = await connect(spec)
    try:
        await connection.probe(spec.call_timeout)
    except BaseException:
        if spec.scope == "episode":  # a shared one stays the process's (broken: replaced next)
            await connection.close()
        raise
    return connection


async def checkout(spec: MCPServer, replacing: MCPConnection | None = None) -> MCPConnection:
    """`connect`, or with ``replacing`` `reconnect`, awaited from any loop (an episode's).

    A session that opened just as the caller was cancelled is closed, not leaked: ``handed``
    passes it over, and its one change of state decides whether the caller or the hub owns
    it. Why not the future `_submit` returns: cancelled after `connect` had returned but
    before the hub's callback copied the result into it, it dropped the session unseen, and
    the episode's server ran on for nobody.
    """
    handed: concurrent.futures.Future[MCPConnection] = concurrent.futures.Future()
    opening = connect(spec) if replacing is None else reconnect(spec, replacing)
    running = _submit(_hand_over(opening, handed, spec))
    try:
        return await asyncio.wrap_future(handed)
    except BaseException:
        running.cancel()  # still opening: it stops, closing what it started
        if spec.scope == "episode":
            handed.add_done_callback(_close_unclaimed)
        raise


async def _hand_over(
    opening: Awaitable[MCPConnection],
    handed: concurrent.futures.Future[MCPConnection],
    spec: MCPServer,
) -> None:
    """Put ``opening``'s session in ``handed``; close it here if the caller gave up first."""
    try:
        connection = await opening
    except BaseException as exc:
        if handed.set_running_or_notify_cancel():
            handed.set_exception(exc)
        raise
    if handed.set_running_or_notify_cancel():
        handed.set_result(connection)
    elif spec.scope == "episode":  # a shared session stays the process's
        await connection.close()


def _close_unclaimed(future: concurrent.futures.Future[MCPConnection]) -> None:
    if not future.cancelled() and future.exception() is None:
        _submit(future.result().close())


async def list_server_tools(spec: MCPServer) -> list[mcp_types.Tool]:
    """The tools ``spec``'s server lists, asked once per process and spec.

    Listing an episode-scoped server starts it just for that; envs are built once per
    episode, so the listing is remembered rather than asked again.
    """
    key = spec.key()
    if key not in _listings:
        try:
            connection = await connect(spec)
        except MCPServerError as exc:
            if exc.exit_status:  # it exited at once, the first time: no retry fixes that
                raise ConfigError(str(exc)) from exc
            raise
        try:
            _listings[key] = await connection.list_tools(spec.call_timeout)
        except ToolError as exc:  # it answered, with an error: it does not serve tools
            raise ConfigError(f"MCP server {spec.label!r} refused to list tools: {exc}") from exc
        finally:
            if spec.scope == "episode":
                await connection.close()
    return list(_listings[key])


async def close_all(connections: list[MCPConnection]) -> None:
    """Close ``connections`` at once; returns when every one is closed."""
    await asyncio.gather(*(c.close() for c in connections))


def close_shared_servers() -> None:
    """Stop every shared server now; the next episode that needs one starts it again.

    Runs at interpreter exit too; call it earlier when done with an env (tests, notebooks).
    """
    if _hub is None:
        return

    async def close() -> None:
        connections = list(_shared.values())
        _shared.clear()
        await close_all(connections)

    on_hub_sync(close())


def _close_everything() -> None:
    """At exit: stop the shared servers and every other server still running.

    An env that was never closed, an eval stopped with Ctrl-C: their episode servers stop and
    their workspace copies are removed.
    """
    close_shared_servers()

    async def close_live() -> None:  # on the hub, the only thread that touches `_live`
        await close_all(list(_live))

    if _hub is not None:
        on_hub_sync(close_live())
    for path in list(_logs):
        _remove_if_empty(path)


def _remove_if_empty(log: str) -> None:
    """Delete ``log`` if it is empty: a server that wrote nothing left nothing to read."""
    try:
        if os.path.getsize(log) == 0:
            os.remove(log)
    except OSError:
        pass


@functools.cache
def _sweep_empty_logs(folder: str) -> None:
    """Delete the empty default logs in ``folder`` of dead processes; once per process.

    Such a process was killed (SIGKILL, or SIGTERM without a handler) before its exit hook
    deleted them (`_close_everything`). A log that holds something stays: it may tell why a
    server failed. The pid in a log's name (`MCPServer.log_path`) says whose it is; a pid
    that another process has taken since only keeps the log until a later sweep.
    """
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid = name.split("-")[1] if name.startswith("mcp-") else ""
        if pid.isdigit() and not process_alive(int(pid)):
            _remove_if_empty(os.path.join(folder, name))


@functools.cache
def _close_at_exit() -> None:
    """One exit hook for every server, registered with the first one (not at import)."""
    atexit.register(_close_everything)
