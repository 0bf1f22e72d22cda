"""The run store's tables and the ordered migrations that build them, one schema for every database.

Both SQLite and PostgreSQL are driven through SQLAlchemy Core with portable types only
(``String``, ``Integer``, ``Boolean``, ``JSON``, ``Text``); times are ISO-8601 UTC strings, so
they sort as text and read back the same on both.

Migrations: ``schema_version`` holds one row, the number of the last step applied. `migrate`
runs the missing steps of `MIGRATIONS` in order, in one transaction, on every open, so an old
database file is upgraded by the first newer ``agentgym`` that opens it. A step is a function
of a `Connection`; once released, a step never changes: a later schema change is a new step
(``ALTER TABLE ...``) appended to the list, and `runs` is edited to match.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from agentgym._errors import ConfigError

from ._store import NAME_LENGTH

metadata = sa.MetaData()

schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, nullable=False),
)

#: One row per run: a CLI ``train``/``eval`` or a job of ``serve``/``sweep`` (queued first).
runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),  # train | eval | sft
    sa.Column("name", sa.String(NAME_LENGTH), nullable=False),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("source", sa.String(16), nullable=False),  # cli | serve | sweep
    sa.Column("config", sa.JSON, nullable=False),  # the resolved config
    sa.Column("job", sa.JSON),  # for queued jobs: {"kind", "config"} as submitted
    sa.Column("resume", sa.Boolean, nullable=False, default=False),  # next start uses --resume
    sa.Column("run_dir", sa.Text),
    sa.Column("exit_code", sa.Integer),
    sa.Column("pid", sa.Integer),
    sa.Column("host", sa.String(255)),
    sa.Column("owner", sa.String(300)),  # "host:pid" of the queue process running the job
    sa.Column("created_at", sa.String(40), nullable=False, index=True),
    sa.Column("started_at", sa.String(40)),
    sa.Column("ended_at", sa.String(40)),
    sa.Column("updated_at", sa.String(40), nullable=False),
    sa.Column("step", sa.Integer),
    sa.Column("figures", sa.JSON, nullable=False),  # headline numbers of summary.json
    sa.Column("error_tail", sa.Text),  # last log lines of a failed run
    sa.Column("attempt", sa.Integer, nullable=False, default=0),
    sa.Column("max_attempts", sa.Integer, nullable=False, default=1),
    sa.Column("cancel_requested", sa.Boolean, nullable=False, default=False),
    sa.Column("sweep_id", sa.String(32), index=True),
)


def _v1_runs(conn: sa.Connection) -> None:
    runs.create(conn)


#: Ordered steps; step ``i`` (1-based) brings a database from version ``i - 1`` to ``i``.
MIGRATIONS: list[Callable[[sa.Connection], None]] = [_v1_runs]

_PG_LOCK_KEY = 0x61676D72  # "agmr": serialises concurrent migrations on PostgreSQL


class NewerDatabaseError(ConfigError, RuntimeError):
    """The database's schema is newer than this code knows: upgrade agentgym.

    A `ConfigError` (the CLI prints one line, exit 2); a `RuntimeError` too, as it was raised
    before, so that code catching that still does.
    """


def migrate(engine: sa.Engine) -> int:
    """Apply the missing steps of `MIGRATIONS`; returns the schema version now in place.

    Raises:
        NewerDatabaseError: the database is newer than this code (a newer agentgym migrated
            it); the user's to fix (upgrade), so one line and exit 2, not a traceback.
    """
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        schema_version.create(conn, checkfirst=True)
        current = conn.execute(sa.select(schema_version.c.version)).scalar()
        if current is None:
            conn.execute(schema_version.insert().values(version=0))
            current = 0
        if current > len(MIGRATIONS):
            shown = engine.url.render_as_string(hide_password=True)
            raise NewerDatabaseError(
                f"the runs database {shown} has schema version {current}, newer than this "
                f"agentgym knows ({len(MIGRATIONS)}); upgrade agentgym, or use another "
                "--db / $AGENTGYM_RUNS_DB"
            )
        for step in MIGRATIONS[current:]:
            step(conn)
        conn.execute(schema_version.update().values(version=len(MIGRATIONS)))
    return len(MIGRATIONS)
