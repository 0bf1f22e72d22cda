"""The run store (every ``agentgym train``/``eval``/``sft``, in SQLite or PostgreSQL), job queue.

See ``docs/experiments.md``. The run folder stays the source of truth for metrics and
trajectories; the database indexes runs (id, kind, status, config, folder, figures) and holds the
queue that ``agentgym serve`` and ``agentgym sweep`` run jobs from.
"""

from ._jobs import JobKind, check_job, job_command, parse_config, submit_job
from ._queue import JobQueue
from ._store import TERMINAL, RunStatus, RunStore, agentgym_home, resolve_db_url
from ._track import EXIT_CONFIG, EXIT_INFRA, is_infra_failure, track_run

__all__ = [
    "EXIT_CONFIG",
    "EXIT_INFRA",
    "JobKind",
    "TERMINAL",
    "JobQueue",
    "RunStatus",
    "RunStore",
    "agentgym_home",
    "check_job",
    "is_infra_failure",
    "job_command",
    "parse_config",
    "resolve_db_url",
    "submit_job",
    "track_run",
]
