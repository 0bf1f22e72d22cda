"""Serve an ASGI app on a loopback port from a daemon thread (tests, benches, embedding).

Why one helper: starting uvicorn in-process needs a bound socket (so the port is known before
the server runs), a deadline on its ``started`` flag (a server that fails to bind or import
must not hang the caller) and a clean stop; the dashboard tests and bench share it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def serve_in_thread(app: Any, start_timeout: float = 30.0) -> Iterator[str]:
    """Run ``app`` with uvicorn on 127.0.0.1 at a free port; yield its base URL.

    Raises:
        RuntimeError: the server did not start within ``start_timeout`` seconds.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    try:
        while not server.started:  # poll the server's own flag, with a deadline
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {start_timeout:g} s")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
