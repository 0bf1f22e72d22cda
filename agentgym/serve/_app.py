"""The HTTP API of ``agentgym serve``: submit, list, get, follow and cancel jobs (FastAPI).

A job is a run of the run store (`agentgym.runs.RunStore`); ``GET /jobs`` lists every run,
including those started from the CLI. The queue (`agentgym.runs.JobQueue`) runs in the server's
event loop; the database holds it, so a restarted server carries on (see `JobQueue.recover`).

With a token every request, including ``/openapi.json``, needs ``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from agentgym._errors import ConfigError
from agentgym.runs import TERMINAL, JobQueue, RunStore, submit_job
from agentgym.runs._folder import log_path

from ._dashboard import dashboard_router
from ._files import metric_lines

#: How often a followed log or metrics file is looked at for new lines.
FOLLOW_POLL_S = 0.25


class JobRequest(BaseModel):
    """A job to queue: ``kind`` and its config (a mapping, or YAML/JSON text)."""

    kind: Literal["train", "eval"]
    config: dict[str, Any] | str = Field(
        description="train: a GRPOConfig; eval: env plus `agentgym eval` options by name."
    )
    name: str | None = Field(None, max_length=200, description="Default: <kind>-<env>.")
    max_attempts: int = Field(
        3, ge=1, le=20, description="Starts allowed, counting retries after infra failures."
    )


class Job(BaseModel):
    """A run as the index holds it (its folder holds the metrics and trajectories)."""

    id: str
    kind: str
    name: str
    status: str
    source: str
    run_dir: str | None
    config: dict[str, Any]
    exit_code: int | None
    pid: int | None
    host: str | None
    created_at: str
    started_at: str | None
    ended_at: str | None
    step: int | None
    figures: dict[str, float]
    error_tail: str | None
    attempt: int
    max_attempts: int
    resume: bool
    cancel_requested: bool
    sweep_id: str | None


def create_app(
    store: RunStore,
    *,
    runs_root: Path,
    workers: int = 2,
    token: str | None = None,
    poll_s: float = 0.5,
) -> FastAPI:
    """The API app over ``store``; its lifespan runs a `JobQueue` of ``workers`` processes."""
    queue = JobQueue(store, workers=workers, poll_s=poll_s)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        queue.recover()
        runner = asyncio.create_task(queue.run())
        try:
            yield
        finally:
            await queue.shutdown()
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner

    app = FastAPI(title="agentgym", summary="Submit and watch agentgym jobs.", lifespan=lifespan)
    if token is not None:
        app.middleware("http")(_bearer_check(token))

    @app.post("/jobs", status_code=201, response_model=Job)
    def submit(request: JobRequest) -> dict[str, Any]:
        """Queue a train or eval job; 400 with the reason if its config would be refused."""
        try:
            run_id = submit_job(
                store, request.kind, request.config, runs_root=runs_root, source="serve",
                name=request.name, max_attempts=request.max_attempts,
            )  # fmt: skip
        except ConfigError as exc:
            raise HTTPException(400, str(exc)) from None
        queued = _get(store, run_id)
        queue.wake()
        return queued

    @app.get("/jobs", response_model=list[Job])
    def list_jobs(
        status: str | None = None, limit: int = Query(200, ge=1, le=10_000)
    ) -> list[dict[str, Any]]:
        """Runs and jobs, newest first."""
        return store.list_runs(limit, status=status)

    @app.get("/jobs/{run_id}", response_model=Job)
    def get_job(run_id: str) -> dict[str, Any]:
        """One run or job."""
        return _get(store, run_id)

    @app.post("/jobs/{run_id}/cancel", response_model=Job)
    def cancel_job(run_id: str) -> dict[str, Any]:
        """Cancel a job: a queued one now, a running one gets SIGTERM (SIGKILL after a grace)."""
        _get(store, run_id)
        row = store.request_cancel(run_id)
        queue.wake()
        return row or _get(store, run_id)

    @app.get("/jobs/{run_id}/logs", response_class=StreamingResponse)
    def job_logs(run_id: str, follow: bool = False) -> StreamingResponse:
        """The job's log as text lines; ``follow``: stream new lines until the job ends."""
        run_dir = _get(store, run_id)["run_dir"]
        lines = _follow(store, run_id, lambda: log_path(run_dir) if run_dir else None, follow, None)
        return StreamingResponse(lines, media_type="text/plain; charset=utf-8")

    @app.get("/jobs/{run_id}/metrics", response_class=StreamingResponse)
    def job_metrics(run_id: str, follow: bool = False) -> StreamingResponse:
        """NDJSON: train ``metrics.jsonl`` lines, or per-episode rewards of an eval."""
        run = _get(store, run_id)
        path, project = metric_lines(run["kind"], run["run_dir"])
        lines = _follow(store, run_id, lambda: path, follow, project)
        return StreamingResponse(lines, media_type="application/x-ndjson")

    @app.get("/health")
    def health() -> dict[str, Any]:
        """Liveness, and the database's schema version."""
        return {"ok": True, "schema_version": store.schema_version}

    app.include_router(dashboard_router(store))
    return app


def _get(store: RunStore, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    if run is None:
        raise HTTPException(404, f"no job {run_id!r}; GET /jobs lists them")
    return run


_Next = Callable[[Request], Awaitable[Response]]


def _bearer_check(token: str) -> Callable[[Request, _Next], Awaitable[Response]]:
    """Middleware answering 401 unless the request carries ``Authorization: Bearer token``."""
    expected = f"Bearer {token}".encode()

    async def check(request: Request, call_next: _Next) -> Response:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return JSONResponse(
                {"detail": "missing or wrong token: send 'Authorization: Bearer <token>'"},
                status_code=401, headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        return await call_next(request)

    return check


async def _follow(
    store: RunStore,
    run_id: str,
    path_of: Callable[[], Path | None],
    follow: bool,
    project: Callable[[bytes], bytes | None] | None,
) -> AsyncIterator[bytes]:
    """Complete lines of a growing file; with ``follow``, until the run is in a final state."""
    offset, pending = 0, b""
    while True:
        done = not follow or _finished(store, run_id)
        path = path_of()
        chunk = _read_from(path, offset) if path is not None else b""
        offset += len(chunk)
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            out = project(line) if project is not None else line
            if out is not None:
                yield out + b"\n"
        if not chunk and done:
            return
        if not chunk:
            await asyncio.sleep(FOLLOW_POLL_S)


def _finished(store: RunStore, run_id: str) -> bool:
    run = store.get_run(run_id)
    return run is None or run["status"] in TERMINAL


def _read_from(path: Path, offset: int) -> bytes:
    with contextlib.suppress(OSError), path.open("rb") as f:
        f.seek(offset)
        return f.read(1 << 20)
    return b""
