"""Host side of the in-container code server: one ``docker exec`` kept open, JSON lines.

The exec is attached without a TTY, so the daemon multiplexes the server's stdout and stderr
into frames (8-byte header: stream id, 3 zero bytes, big-endian length). Replies are read from
the stdout frames; stderr frames are kept (the last few KiB) to explain a crashed server.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from pathlib import Path
from typing import Any

SERVER_SOURCE = Path(__file__).with_name("_server.py").read_text()
STDERR_KEEP = 4096


SERVER_CWD = "/"
"""The server's cwd: a directory of the read-only root, which the code cannot write to."""


def server_argv(workdir: str) -> list[str]:
    """The command that starts the code server in `SERVER_CWD`: nothing the code wrote runs.

    Why: the server starts again (a reset, or a recovery after the code killed it) in a
    container whose work dir still holds what the code left there, and before it wipes it.
    ``python3 -c`` puts its cwd first on ``sys.path``, so with the work dir as cwd a
    ``base64.py`` left there was imported by the new server; and ``$HOME`` is the work dir,
    so a ``.pth`` file in the user site-packages ran at its start. Either made the code part
    of the server for every later lease of the container, where it could read each episode's
    calls or forge verify's reports. So the server starts in `SERVER_CWD` and without the
    user site-packages (``-s``); the calls it forks still ``chdir`` to the work dir
    (``_become``), so the code imports its own modules from there as before.
    """
    return ["python3", "-s", "-c", SERVER_SOURCE, workdir]


class ChannelDeadline(Exception):
    """No reply before the host-side deadline."""


class ChannelClosed(Exception):
    """The server's exec ended (the server died or was killed)."""


class ServerChannel:
    """A running code server inside one container, reached through an attached exec."""

    def __init__(self, api: Any, container_id: str, user: str, workdir: str,
                 environment: dict[str, str]) -> None:
        self._api = api
        self._container_id = container_id
        self._user = user
        self._workdir = workdir
        self._environment = environment
        self._raw: Any = None  # the docker-py socket wrapper (keeps the HTTP response alive)
        self._sock: socket.socket | None = None
        self._frames = b""
        self._lines = b""
        self.stderr_tail = b""
        self.server_pid: int | None = None
        self._next_id = 0

    def open(self, timeout: float = 30.0) -> None:
        """Start the server and wait for it (it wipes nothing: a ``reset`` request does)."""
        exec_id = self._api.exec_create(
            self._container_id, server_argv(self._workdir), stdin=True, stdout=True,
            stderr=True, tty=False, user=self._user, workdir=SERVER_CWD,
            environment=self._environment,
        )["Id"]
        self._raw = self._api.exec_start(exec_id, socket=True)
        self._sock = getattr(self._raw, "_sock", self._raw)
        self._frames = self._lines = self.stderr_tail = b""
        hello = self._read_line(time.monotonic() + timeout)
        self.server_pid = hello.get("pid")

    def request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and return its reply; raises ChannelDeadline / ChannelClosed."""
        if self._sock is None:
            raise ChannelClosed("the code server is not running")
        self._next_id += 1
        payload = {**payload, "id": self._next_id}
        try:
            self._sock.sendall(json.dumps(payload).encode() + b"\n")
        except OSError as exc:
            raise ChannelClosed(f"cannot write to the code server: {exc}") from exc
        return self.next_reply(timeout)

    def next_reply(self, timeout: float) -> dict[str, Any]:
        """The server's next line about the last request; raises ChannelDeadline / ChannelClosed.

        Why apart from `request`: a call with ``wipe`` gets two, the clean-up's end first.
        """
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_line(deadline)
            if reply.get("id") == self._next_id:
                return reply

    def close(self) -> None:
        """Close the exec's stream; the server exits on end of input."""
        raw, self._sock, self._raw = self._raw, None, None
        if raw is not None:
            close_stream(raw)

    @property
    def is_open(self) -> bool:
        """True while the exec stream is connected."""
        return self._sock is not None

    def _read_line(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self._lines:
            self._read_frame(deadline)
        line, self._lines = self._lines.split(b"\n", 1)
        return json.loads(line)

    def _read_frame(self, deadline: float) -> None:
        header = self._recv_exact(8, deadline)
        stream, size = header[0], struct.unpack(">I", header[4:])[0]
        body = self._recv_exact(size, deadline)
        if stream == 2:
            self.stderr_tail = (self.stderr_tail + body)[-STDERR_KEEP:]
        else:
            self._lines += body

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        if self._sock is None:
            raise ChannelClosed("the channel to the code server is closed")
        while len(self._frames) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelDeadline("no reply from the code server before the deadline")
            self._sock.settimeout(remaining)
            try:
                data = self._sock.recv(1 << 16)
            except TimeoutError as exc:
                raise ChannelDeadline("no reply from the code server before the deadline") from exc
            except OSError as exc:
                raise ChannelClosed(f"code server connection failed: {exc}") from exc
            if not data:
                tail = self.stderr_tail.decode("utf-8", "replace").strip()[-500:]
                raise ChannelClosed("the code server exited" + (f": {tail}" if tail else ""))
            self._frames += data
        out, self._frames = self._frames[:n], self._frames[n:]
        return out


def close_stream(raw: Any, *, shutdown: bool = True) -> None:
    """Close a docker-py attached stream: its socket, wrapper and HTTP response (never raises).

    ``shutdown`` ends the connection even where a forked process holds a copy of it; a forked
    process closing its copy of its parent's stream must not (it would end the parent's too).
    """
    sock = getattr(raw, "_sock", raw)
    if shutdown:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    for closable in (sock, raw, getattr(raw, "_response", None)):
        if closable is not None:
            with contextlib.suppress(Exception):
                closable.close()
