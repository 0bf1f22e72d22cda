"""A throwaway PostgreSQL server for the run-store and API tests, from the real binaries.

`database_url()` starts one server per test session (``initdb`` + ``postgres`` in a temp
folder, a free loopback port, its unix socket in the folder, no fsync) and returns the URL of a
new empty database on it. ``initdb`` refuses to run as root, so under root both run as
``nobody`` (``runuser``). Missing binaries skip the test (fail under AGENTGYM_STRICT_DEPS=1).
"""

from __future__ import annotations

import atexit
import functools
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from agentgym.engine._serve import free_port
from tests.conftest import end_process, require, skip_or_fail

_names = itertools.count()


#: Database backends the tests run against (the ``backend`` fixture params).
BACKENDS = ("sqlite", "postgresql")


def backend_url(backend: str, tmp_path: Path) -> str:
    """A fresh empty database of ``backend``: a SQLite file in ``tmp_path``, or a PG database."""
    return f"sqlite:///{tmp_path / 'runs.db'}" if backend == "sqlite" else database_url()


def database_url() -> str:
    """``postgresql+psycopg://`` URL of a fresh database on the session's server."""
    psycopg = require("psycopg")
    port = _server_port()
    name = f"agentgym_{os.getpid()}_{next(_names)}"
    with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/{name}"


def _binary(name: str) -> str:
    installed = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    found = shutil.which(name) or (installed[-1] if installed else None)
    if found is None:
        skip_or_fail(f"PostgreSQL's {name} is not installed (apt-get install postgresql)")
    return found


@functools.cache
def _server_port() -> int:
    psycopg = require("psycopg")
    initdb, postgres = _binary("initdb"), _binary("postgres")
    root = Path(tempfile.mkdtemp(prefix="agentgym-pg-", dir="/tmp"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(root, nobody.pw_uid, nobody.pw_gid)
        as_user = ["runuser", "-u", "nobody", "--"]
    data = root / "data"
    subprocess.run(
        [*as_user, initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync",
         "-E", "UTF8"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    server = subprocess.Popen(
        [*as_user, postgres, "-D", str(data), "-p", str(port), "-k", str(root),
         "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"],
        stdout=subprocess.DEVNULL, stderr=(root / "server.log").open("wb"),
    )  # fmt: skip
    atexit.register(_stop, server, root)
    deadline = time.monotonic() + 60
    while True:
        try:
            psycopg.connect(f"host=127.0.0.1 port={port} user=postgres", connect_timeout=2).close()
            return port
        except psycopg.OperationalError:
            if server.poll() is not None or time.monotonic() > deadline:
                log = (root / "server.log").read_text(errors="replace")
                raise RuntimeError(f"postgres did not start:\n{log[-2000:]}") from None
            time.sleep(0.1)  # polling a server we cannot get an event from


def _stop(server: subprocess.Popen[bytes], root: Path) -> None:
    end_process(server, timeout=20)
    shutil.rmtree(root, ignore_errors=True)
