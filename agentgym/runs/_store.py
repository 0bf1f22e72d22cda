"""`RunStore`: the index of every run in SQLite (default) or PostgreSQL, and the job queue's table.

The run folder stays the source of truth for metrics and trajectories; a row holds what is
needed to find, list and compare runs (status, config, folder, headline figures) and, for jobs
of ``agentgym serve``/``sweep``, what is needed to start them again.

Which database: ``url`` if given, else ``$AGENTGYM_RUNS_DB``, else the SQLite file
``$AGENTGYM_HOME/runs.db`` (``~/.cache/agentgym/runs.db``). A plain path means a SQLite file;
anything with ``://`` is a SQLAlchemy URL (``postgresql+psycopg://user@host/db``).

SQLite is opened in WAL mode and every transaction that may write starts with ``BEGIN
IMMEDIATE``: the CLI, the server and its workers are separate processes writing the same file,
and an immediate transaction waits for the lock (``busy_timeout``) instead of failing on a lock
upgrade. A read (`RunStore.get_run`, `list_runs`, `find_run`, the look for a queued job) starts
with a plain, deferred ``BEGIN``: in WAL mode it reads a snapshot without taking the lock, so a
writer holding it (a long transaction, a stuck process) does not hold up listings, the
dashboard or a queue's poll.

A database that cannot be opened (unknown scheme, missing driver, host down or unresolvable,
folder that cannot be made) is a `ConfigError` of one line naming it, password hidden, and the
fix (``--db`` / ``$AGENTGYM_RUNS_DB``), not a traceback.

SQLAlchemy (and `agentgym.runs._schema`, built on it) is imported by the functions that use the
database, not with this module: every ``agentgym`` command imports it (``RunStatus``, the
command modules), and one that never opens a store (``check``, ``--help``) would pay ~0.3 s.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import uuid
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from agentgym._errors import ConfigError
from agentgym._pid import process_alive

from ._folder import read_step

if TYPE_CHECKING:
    import sqlalchemy as sa

#: ``AGENTGYM_RUNS_DB`` value that turns indexing of CLI runs off.
DISABLED = "off"
#: Execution option marking a connection whose transactions only read (see `_make_engine`).
_READ_ONLY = "agentgym_read_only"


class RunStatus(StrEnum):
    """Where a run is in its life."""

    queued = "queued"  # a job waiting for a worker
    running = "running"  # a process is working on it
    finished = "finished"  # exit code 0
    failed = "failed"  # non-zero exit (bad config, crash, infra error after its retries)
    cancelled = "cancelled"  # stopped on request (API, sweep)
    interrupted = "interrupted"  # its process died without finishing (kill, Ctrl-C, host crash)


#: The longest run name the index keeps (`agentgym.runs._schema` makes ``runs.name`` this long).
NAME_LENGTH = 200

#: States a run does not leave by itself (an interrupted job may still be re-queued).
TERMINAL = frozenset(
    {RunStatus.finished, RunStatus.failed, RunStatus.cancelled, RunStatus.interrupted}
)


def agentgym_home() -> Path:
    """``$AGENTGYM_HOME``, default ``~/.cache/agentgym``."""
    return Path(os.environ.get("AGENTGYM_HOME") or Path.home() / ".cache" / "agentgym")


def resolve_db_url(url: str | None = None) -> str:
    """The database URL to use: ``url``, ``$AGENTGYM_RUNS_DB``, or the default SQLite file."""
    chosen = url or os.environ.get("AGENTGYM_RUNS_DB") or str(agentgym_home() / "runs.db")
    if "://" in chosen:
        database = chosen.partition(":///")[2] if chosen.startswith("sqlite") else ""
        if database and Path(database).is_dir():
            raise _folder_not_file(chosen, Path(database))
        return chosen
    path = Path(chosen).expanduser().resolve()
    if path.is_dir():
        raise _folder_not_file(str(path), path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = f"cannot create its folder {path.parent}: {exc.strerror or exc}"
        raise _cannot_open(str(path), reason) from exc
    return f"sqlite:///{path}"


def now_iso() -> str:
    """The current UTC time, ISO-8601 with microseconds (sorts as text)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


def new_run_id() -> str:
    """A fresh run id: 12 hex digits."""
    return uuid.uuid4().hex[:12]


class RunStore:
    """Rows of runs in one database; safe to use from several processes at once.

    Args:
        url: see the module docstring; None uses the environment or the default file.

    Example::

        store = RunStore("sqlite:////tmp/runs.db")
        run_id = store.create_run(kind="eval", name="calc", config={}, source="cli",
                                  status=RunStatus.running)
        store.update_run(run_id, status=RunStatus.finished, exit_code=0)
        store.list_runs()[0]["status"]  # 'finished'
    """

    def __init__(self, url: str | None = None) -> None:
        import sqlalchemy as sa

        from ._schema import migrate

        resolved = resolve_db_url(url)
        try:  # parses the URL and imports the driver; connects later
            self.engine = _make_engine(resolved)
        except (sa.exc.ArgumentError, ValueError, ImportError) as exc:
            raise _cannot_open(resolved, exc) from exc
        # the same pool; its transactions begin deferred on SQLite (module docstring)
        self._reader = self.engine.execution_options(**{_READ_ONLY: True})
        try:  # the first connection
            self.schema_version = migrate(self.engine)
        except sa.exc.DBAPIError as exc:
            self.engine.dispose()
            raise _cannot_open(resolved, exc.orig if exc.orig is not None else exc) from exc

    @property
    def url(self) -> str:
        """The URL with its password, for the worker processes this store starts."""
        return self.engine.url.render_as_string(hide_password=False)

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()

    # ---- writing --------------------------------------------------------------------------
    def create_run(
        self,
        *,
        kind: str,
        name: str,
        config: Mapping[str, Any],
        source: str,
        status: RunStatus = RunStatus.queued,
        run_dir: str | os.PathLike[str] | None = None,
        job: Mapping[str, Any] | None = None,
        max_attempts: int = 1,
        sweep_id: str | None = None,
        run_id: str | None = None,
        **values: Any,
    ) -> str:
        """Insert a run; returns its id (``run_id``, or a new one). ``values``: other columns."""
        from ._schema import runs

        run_id = run_id or new_run_id()
        stamp = now_iso()
        # cut to the column's length: PostgreSQL refuses a longer name (the run went
        # unindexed, a sweep died with a traceback) where SQLite stored it whole
        name = name[:NAME_LENGTH]
        row = {
            "id": run_id, "kind": kind, "name": name, "status": str(status), "source": source,
            "config": _jsonable(config), "job": _jsonable(job) if job is not None else None,
            "run_dir": str(run_dir) if run_dir is not None else None, "created_at": stamp,
            "updated_at": stamp, "figures": {}, "max_attempts": max_attempts,
            "sweep_id": sweep_id, "attempt": 0, "resume": False, "cancel_requested": False,
        }  # fmt: skip
        with self.engine.begin() as conn:
            conn.execute(runs.insert().values(row | values))
        return run_id

    def update_run(
        self, run_id: str, *, only_if: Mapping[str, Any] | None = None, **values: Any
    ) -> bool:
        """Set columns of a run; with ``only_if`` (column: value), only when they all match.

        Returns whether a row changed: a guarded update that lost a race returns False.
        """
        from ._schema import runs

        query = runs.update().where(runs.c.id == run_id)
        for column, expected in (only_if or {}).items():
            query = query.where(runs.c[column] == expected)
        values = {k: str(v) if isinstance(v, RunStatus) else v for k, v in values.items()}
        if "config" in values:
            values["config"] = _jsonable(values["config"])
        with self.engine.begin() as conn:
            result = conn.execute(query.values(updated_at=now_iso(), **values))
        return bool(result.rowcount)

    def claim_next(self, owner: str, *, sweep_id: str | None = None) -> dict[str, Any] | None:
        """Take the oldest queued job of ``sweep_id`` (None: of no sweep) for ``owner``, or None.

        The job becomes ``running`` with ``attempt`` + 1; the guarded update makes two queue
        processes racing for one job end with exactly one owner.
        """
        import sqlalchemy as sa

        from ._schema import runs

        while True:
            query = sa.select(runs.c.id, runs.c.attempt).where(
                runs.c.status == "queued",
                runs.c.sweep_id == sweep_id,  # None: IS NULL
            )
            with self._reader.connect() as conn:
                row = conn.execute(query.order_by(runs.c.created_at).limit(1)).first()
            if row is None:
                return None
            claimed = self.update_run(
                row.id, only_if={"status": "queued"}, status=RunStatus.running, owner=owner,
                attempt=row.attempt + 1, pid=None, host=socket.gethostname(),
                started_at=now_iso(), ended_at=None, exit_code=None, error_tail=None,
            )  # fmt: skip
            if claimed:
                return self.get_run(row.id)

    def release(self, run_id: str, owner: str) -> bool:
        """Hand back a job ``owner`` claimed (`claim_next`) but started no process for.

        Why: a queue stopped or cancelled between its claim and the start of the process left
        the job ``running`` with no process; the next queue found it interrupted with no
        checkpoint, and a job that never ran stayed ``interrupted``. It is ``queued`` again,
        with the attempt it did not use. Returns whether it was handed back.
        """
        from ._schema import runs

        return self.update_run(
            run_id, only_if={"owner": owner, "status": "running", "pid": None},
            status=RunStatus.queued, owner=None, attempt=runs.c.attempt - 1, host=None,
            started_at=None,
        )  # fmt: skip

    def request_cancel(self, run_id: str, *, why: str | None = None) -> dict[str, Any] | None:
        """Ask for a run to stop: a queued job is cancelled now, a running one by its queue.

        An ``interrupted`` job (its process is gone) is cancelled now too, so that no queue
        resumes it. ``why`` becomes the ``error_tail`` of a job cancelled now. Each change is
        guarded by the state it starts from: a job claimed meanwhile is cancelled as a running
        one, and a second cancel changes nothing. The one way jobs are cancelled (the API, a
        stopped sweep). Returns the row after the change, or None if there is no such run.
        """
        said = {"error_tail": why} if why is not None else {}
        for waiting in ("queued", "interrupted"):
            self.update_run(
                run_id, only_if={"status": waiting}, status=RunStatus.cancelled,
                cancel_requested=True, ended_at=now_iso(), **said,
            )  # fmt: skip
        self.update_run(run_id, only_if={"status": "running"}, cancel_requested=True)
        return self.get_run(run_id)

    def reconcile(self, *, jobs: bool = False) -> list[dict[str, Any]]:
        """Mark ``running`` rows of this host whose process died as ``interrupted``.

        A CLI run's process is its own ``pid``; a job's is its queue's (``owner``), and only
        a queue recovering its jobs (``jobs=True``) settles those: marked by a viewer
        (``runs ls``) while the queue was down, a job was no longer ``running`` when the
        restarted queue looked, so its orphaned worker was never stopped nor the job resumed.
        But a sweep's job has no queue to recover it (each sweep runs its own jobs only), so
        anyone settles it once its queue and its worker (``pid``) are both gone: after a
        ``kill -9`` of its sweep it read ``running`` forever; its jobs still ``queued`` are
        cancelled then (`request_cancel`), saying why.
        Rows of other hosts are left alone. Returns the rows changed (as they were before).

        The row takes the step its run folder recorded when it is further than the row's:
        a killed process never filed its step, so ``runs ls`` showed "-" for a run whose
        ``status.json`` said how far it got.
        """
        host = socket.gethostname()
        changed = []
        dead_sweeps: dict[str, int | None] = {}  # sweep id: its queue's pid
        for row in self.list_runs(limit=None, status=RunStatus.running):
            orphan = row["sweep_id"] is not None  # no queue recovers a sweep's jobs
            if row["host"] != host or (row["job"] is not None and not jobs and not orphan):
                continue
            pid = _owner_pid(row["owner"]) if row["owner"] else row["pid"]
            if process_alive(pid) or (orphan and process_alive(row["pid"])):
                continue
            if self.update_run(
                row["id"], only_if={"status": "running", "owner": row["owner"]},
                status=RunStatus.interrupted, **self._how_it_ended(row),
            ):  # fmt: skip
                changed.append(row)
                if orphan:
                    dead_sweeps[row["sweep_id"]] = pid
        for sweep_id, sweep_pid in dead_sweeps.items():
            why = (f"its agentgym sweep (pid {sweep_pid}) died before this job ran; run the "
                   "sweep again for it")  # fmt: skip
            for run in self.list_runs(limit=None, status=RunStatus.queued, sweep_id=sweep_id):
                self.request_cancel(run["id"], why=why)
        return changed

    def _how_it_ended(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """``ended_at`` (and ``step``, when its folder tells more) of a run whose process died.

        Why not the folder's step and the time now: a later run that took the folder (an sft
        killed at step 2, rerun to step 6 into the same OUT) wrote it since, and the killed row
        was listed at the rerun's step, ended when ``runs ls`` ran. Taken over, the row keeps
        its own step and ended when the taker started, at the latest; else it takes its
        folder's step and ended at its folder's last write (never before it started).
        """
        taker = self._taker_of(row)
        if taker is not None:
            return {"ended_at": taker["started_at"] or taker["created_at"]}
        run_dir = Path(row["run_dir"]) if row["run_dir"] else None
        reached = read_step(run_dir) if run_dir is not None else None
        further = reached is not None and (row["step"] is None or reached > row["step"])
        ended, last = now_iso(), _last_write(run_dir) if run_dir is not None else None
        if last is not None:
            ended = min(ended, max(last, row["started_at"] or last))
        return {"ended_at": ended, **({"step": reached} if further else {})}

    def _taker_of(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        """The first run after ``row`` that took its folder (`took_folder`), or None."""
        if not row["run_dir"]:
            return None
        later = [r for r in self.list_runs(limit=None, run_dir=row["run_dir"])
                 if r["created_at"] > row["created_at"] and took_folder(r)]  # fmt: skip
        return later[-1] if later else None  # newest first: the last is the first to take it

    def delete_run(self, run_id: str, *, only_if: Mapping[str, Any] | None = None) -> bool:
        """Remove a run's row; with ``only_if`` (column: value), only when they all match.

        Why: a CLI process that was refused, or had nothing to do, in a folder another row
        indexes, leaves no row of its own (`agentgym.runs._track`). Returns whether it went.
        """
        from ._schema import runs

        query = runs.delete().where(runs.c.id == run_id)
        for column, expected in (only_if or {}).items():
            query = query.where(runs.c[column] == expected)
        with self.engine.begin() as conn:
            return bool(conn.execute(query).rowcount)

    # ---- reading (the dashboard reads runs only through these two) ------------------------
    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """One run as a dict of its columns (``config`` and ``figures`` dicts), or None."""
        import sqlalchemy as sa

        from ._schema import runs

        with self._reader.connect() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.id == run_id)).first()
        return _as_dict(row) if row is not None else None

    def list_runs(
        self,
        limit: int | None = 200,
        *,
        status: str | None = None,
        sweep_id: str | None = None,
        run_dir: str | None = None,
    ) -> list[dict[str, Any]]:
        """Runs, newest first, as dicts (see `get_run`); ``limit=None`` returns all.

        ``run_dir``: only rows naming that folder, spelled as the row stores it (resolved).
        """
        import sqlalchemy as sa

        from ._schema import runs

        query = sa.select(runs).order_by(runs.c.created_at.desc())
        if run_dir is not None:
            query = query.where(runs.c.run_dir == run_dir)
        if status is not None:
            query = query.where(runs.c.status == str(status))
        if sweep_id is not None:
            query = query.where(runs.c.sweep_id == sweep_id)
        if limit is not None:
            query = query.limit(limit)
        with self._reader.connect() as conn:
            return [_as_dict(row) for row in conn.execute(query)]

    def find_run(self, prefix: str) -> dict[str, Any] | None:
        """The run whose id is ``prefix`` or starts with it, when exactly one does."""
        import sqlalchemy as sa

        from ._schema import runs

        exact = self.get_run(prefix)
        if exact is not None:
            return exact
        query = sa.select(runs).where(runs.c.id.startswith(prefix, autoescape=True)).limit(2)
        with self._reader.connect() as conn:
            rows = conn.execute(query).all()
        return _as_dict(rows[0]) if len(rows) == 1 else None


def took_folder(run: Mapping[str, Any]) -> bool:
    """Whether ``run`` worked in its folder: it runs (or waits to), or recorded a step or figures.

    Why: a command refused before any work (a ``--resume`` whose config differs) records
    neither, and does not name the folder's run (`agentgym runs show FOLDER`).
    """
    working = run["status"] in (RunStatus.running, RunStatus.queued)
    return working or run["step"] is not None or bool(run["figures"])


def _last_write(run_dir: Path) -> str | None:
    """When anything at the top of ``run_dir`` was last written (ISO, UTC), or None."""
    try:
        stamps = [entry.stat().st_mtime for entry in os.scandir(run_dir)]
    except OSError:
        return None
    if not stamps:
        return None
    when = datetime.datetime.fromtimestamp(max(stamps), datetime.UTC)
    return when.isoformat(timespec="microseconds")


def _jsonable(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as JSON reads it back: a YAML date or a `Path` becomes a string."""
    return dict(json.loads(json.dumps(dict(data), default=str)))


def _as_dict(row: sa.Row[Any]) -> dict[str, Any]:
    data = dict(row._mapping)
    data["figures"] = data.get("figures") or {}
    data["config"] = data.get("config") or {}
    return data


def _owner_pid(owner: str) -> int | None:
    _, _, pid = owner.rpartition(":")
    return int(pid) if pid.isdigit() else None


def _cannot_open(url: str, reason: BaseException | str) -> ConfigError:
    """The one-line error for a database that cannot be opened, its password hidden."""
    import sqlalchemy as sa

    password: str | None
    try:
        parsed = sa.engine.make_url(url)
        shown, password = parsed.render_as_string(hide_password=True), parsed.password
    except (sa.exc.ArgumentError, ValueError):  # unparsable: hide what stands where one would
        match = re.search(r"://[^/@]*?:([^/@]*)@", url)
        shown, password = url, match.group(1) if match else None
        if match:
            shown = f"{url[: match.start(1)]}***{url[match.end(1) :]}"
    text = " ".join(str(reason).split()) or type(reason).__name__  # may span lines
    if password:  # a driver's message could quote it, as typed or %-encoded; as a whole
        for secret in {password, quote(password, safe="")}:  # word ("p" hid every p of it)
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "***", text)
    return ConfigError(
        f"cannot open the runs database {shown} ({text}); check --db / $AGENTGYM_RUNS_DB"
    )


def _folder_not_file(url: str, folder: Path) -> ConfigError:
    """A SQLite "file" that is a folder (sqlite's own word: "unable to open database file")."""
    reason = f"a folder, not a database file; name a file in it, e.g. {folder / 'runs.db'}"
    return _cannot_open(url, reason)


def _make_engine(url: str) -> sa.Engine:
    import sqlalchemy as sa

    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True)
    engine = sa.create_engine(url, connect_args={"timeout": 30})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy, not the driver, begins transactions
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA busy_timeout=30000")

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # a read takes no lock: IMMEDIATE made every read wait behind any writer (module doc)
        read_only = conn.get_execution_options().get(_READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine
