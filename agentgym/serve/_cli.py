"""``agentgym serve``: start the job API; mounted by `agentgym.cli`.

Refuses to start, with one line naming the fix, when the address is not loopback and no token
is given, when the run database cannot be opened, or when the port is taken. Prints
``listening on http://HOST:PORT`` once it accepts connections (``--port 0`` picks a free port).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from pathlib import Path
from typing import Annotated

import typer

from agentgym._errors import ConfigError
from agentgym._extras import needs_extra
from agentgym.runs import RunStore, agentgym_home


def serve(
    host: Annotated[str, typer.Option(help="Address to bind; not loopback needs --token.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="0: a free port.")] = 8765,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="AGENTGYM_SERVE_TOKEN",
            help="Require 'Authorization: Bearer TOKEN' on every request.",
        ),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Jobs running at once.")] = 2,
    runs_dir: Annotated[
        Path | None, typer.Option(help="Where job folders go (default $AGENTGYM_HOME/runs).")
    ] = None,
    db: Annotated[str | None, typer.Option("--db", help="Database URL or SQLite path.")] = None,
) -> None:
    """Serve the HTTP job API (and the dashboard): submit, watch and cancel train/eval/sft jobs."""
    if not _is_loopback(host) and not token:
        raise ConfigError(
            f"--host {host} makes the API reachable from other machines; pass --token SECRET "
            "(clients send 'Authorization: Bearer SECRET') or bind 127.0.0.1"
        )
    with needs_extra("agentgym serve", "tools"):
        import uvicorn

        from ._app import create_app
    store = RunStore(db)  # a database it cannot open: a ConfigError, before the port is taken
    try:
        sock = _listen(host, port)
    except ConfigError:
        store.close()
        raise
    app = create_app(
        store, runs_root=runs_dir or agentgym_home() / "runs", workers=workers, token=token
    )
    bound_host, bound_port = sock.getsockname()[:2]
    # a followed log holds its connection until the job ends: do not wait on it to stop
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    typer.echo(f"agentgym serve: listening on http://{bound_host}:{bound_port}", err=True)
    server.run(sockets=[sock])


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket, or a `ConfigError` when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is in use; choose another --port (0 picks a free one)"
            ) from None
        raise ConfigError(f"cannot bind {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock
