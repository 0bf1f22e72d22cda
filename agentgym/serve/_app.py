"""The HTTP API of ``agentgym serve``: submit, list, get, follow and cancel jobs (FastAPI).

A job is a run of the run store (`agentgym.runs.RunStore`); ``GET /jobs`` lists every run,
including those started from the CLI. The queue (`agentgym.runs.JobQueue`) runs in the server's
event loop; the database holds it, so a restarted server carries on (see `JobQueue.recover`).

With a token every request, including ``/openapi.json``, needs ``Authorization: Bearer TOKEN``
(a browser signs in once with ``/?token=TOKEN``, which sets it as a cookie).
Without one the server answers only requests addressed to a loopback name (``Host:
localhost``/``127.0.0.1``/``[::1]``), so a web page cannot reach it through DNS rebinding.
With a token or without, no request that changes jobs may come from another site's page
(``Origin``/``Sec-Fetch-Site``), and a request body over `MAX_BODY` bytes is refused (413), as
is one of unknown length (411).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from agentgym._errors import ConfigError
from agentgym.runs import TERMINAL, JobKind, JobQueue, RunStatus, RunStore, check_job, parse_config
from agentgym.runs._folder import log_path
from agentgym.runs._jobs import queue_checked_job
from agentgym.runs._queue import in_thread

from ._cli import _is_loopback
from ._dashboard import check_folder, dashboard_router
from ._files import metric_lines

#: The cookie a browser signed in with ``/?token=`` sends instead of an Authorization header.
TOKEN_COOKIE = "agentgym_token"
#: How often a followed log or metrics file is looked at for new lines.
FOLLOW_POLL_S = 0.25
#: Methods that change nothing (a cross-site page may still send them: they read nothing back).
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Largest request body accepted (a job config is a few KiB).
MAX_BODY = 1 << 20
#: A followed line longer than this is cut (logs) or dropped (metrics), not buffered further.
MAX_LINE = 1 << 20


class JobRequest(BaseModel):
    """A job to queue: ``kind`` and its config (a mapping, or YAML/JSON text)."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused, not ignored

    kind: JobKind
    config: dict[str, Any] | str = Field(
        description="train: a GRPOConfig; eval: env plus `agentgym eval` options by name; "
        "sft: model plus `agentgym sft` options by name."
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


class SubmittedJob(Job):
    """A job just queued, with what its submitter should know."""

    warnings: list[str] = Field(
        default_factory=list,
        description="The command's warnings, e.g. num_tasks past the env's tasks (the job "
        "plays them all).",
    )


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
        await in_thread(queue.recover)  # store calls and orphan stops: off the event loop
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
    app.add_middleware(_Guard, loopback_only=token is None)  # outermost: runs first

    @app.post("/jobs", status_code=201, response_model=SubmittedJob)
    def submit(request: JobRequest) -> dict[str, Any]:
        """Queue a train, eval or sft job; 400 with the reason if its config would be refused."""
        try:
            config = parse_config(request.config)
            warnings = check_job(request.kind, config)  # returned to the submitter, not logged
            run_id = queue_checked_job(
                store, request.kind, config, runs_root=runs_root, source="serve",
                name=request.name, max_attempts=request.max_attempts,
            )  # fmt: skip
        except ConfigError as exc:
            raise HTTPException(400, str(exc)) from None
        queued = _get(store, run_id)
        queue.wake()
        return {**queued, "warnings": warnings}

    @app.get("/jobs", response_model=list[Job])
    def list_jobs(
        status: str | None = None, limit: int = Query(200, ge=1, le=10_000)
    ) -> list[dict[str, Any]]:
        """Runs and jobs, newest first; ``status`` one of `RunStatus` (else 422)."""
        if status is not None and status not in RunStatus.__members__:
            valid = ", ".join(RunStatus.__members__)
            raise HTTPException(422, f"unknown status {status!r}; use one of: {valid}")
        return store.list_runs(limit, status=status)

    @app.get("/jobs/{run_id}", response_model=Job)
    def get_job(run_id: str) -> dict[str, Any]:
        """One run or job."""
        return _get(store, run_id)

    @app.post("/jobs/{run_id}/cancel", response_model=Job)
    def cancel_job(run_id: str) -> dict[str, Any]:
        """Cancel a job: a queued one now, a running one gets SIGTERM (SIGKILL after a grace).

        409 for a run started from the command line (no queue holds its process) and for a job
        that already finished or failed; cancelling a cancelled job again is a no-op.
        """
        run = _get(store, run_id)
        if _nothing_to_cancel(run):  # first: an ended CLI run was told to "stop its process
            # (pid N)", a pid that may be another's by now
            what = "job" if run["job"] is not None else "run"
            raise HTTPException(409, f"{what} {run_id!r} already {run['status']}; nothing to "
                                     "cancel")  # fmt: skip
        if run["job"] is None:
            raise HTTPException(
                409, f"run {run_id!r} was started from the command line, not as a job; stop "
                f"its process (pid {run['pid']} on {run['host']}) instead",
            )  # fmt: skip
        row = store.request_cancel(run_id)
        queue.wake()
        return row or _get(store, run_id)

    @app.get("/jobs/{run_id}/logs", response_class=StreamingResponse)
    def job_logs(run_id: str, follow: bool = False) -> StreamingResponse:
        """The job's log as text lines; ``follow``: stream new lines until the job ends."""
        run = _get(store, run_id)
        check_folder(run)
        run_dir = run["run_dir"]
        lines = _follow(store, run_id, lambda: log_path(run_dir) if run_dir else None, follow,
                        None, partial=True)  # fmt: skip
        return StreamingResponse(lines, media_type="text/plain; charset=utf-8")

    @app.get("/jobs/{run_id}/metrics", response_class=StreamingResponse)
    def job_metrics(run_id: str, follow: bool = False) -> StreamingResponse:
        """NDJSON: train ``metrics.jsonl`` lines, or per-episode rewards of an eval."""
        run = _get(store, run_id)
        check_folder(run)
        path_of, project = metric_lines(run["kind"], run["run_dir"])
        lines = _follow(store, run_id, path_of, follow, project, partial=False)
        return StreamingResponse(lines, media_type="application/x-ndjson")

    @app.get("/health")
    def health() -> dict[str, Any]:
        """Liveness, and the database's schema version."""
        return {"ok": True, "schema_version": store.schema_version}

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """A body that is not JSON: 422 with one line; other validation errors as FastAPI does."""
        for error in exc.errors():
            if error.get("type") == "json_invalid":
                reason = (error.get("ctx") or {}).get("error", "malformed")
                at = error["loc"][-1] if len(error.get("loc", ())) > 1 else "?"
                return JSONResponse(
                    {"detail": f"the request body is not valid JSON ({reason} at character "
                               f"{at}); send a JSON object such as "
                               '{"kind": "eval", "config": {"env": "calculator"}}'},
                    status_code=422,  # FastAPI's status for it, kept: clients test for it
                )  # fmt: skip
        return await request_validation_exception_handler(request, exc)

    app.include_router(dashboard_router(store))
    return app


def _nothing_to_cancel(run: dict[str, Any]) -> bool:
    """Whether a cancel of ``run`` is refused as too late (409 "already <status>").

    A job that finished or failed; a CLI run in any final state: an interrupted or cancelled
    one has no process left either, and was told to "stop its process (pid N)", a dead pid.
    An interrupted job is still cancelled (so that no queue resumes it), a cancelled one
    again is a no-op.
    """
    if run["job"] is None:
        return run["status"] in TERMINAL
    return run["status"] in (RunStatus.finished, RunStatus.failed)


def _get(store: RunStore, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    if run is None:
        raise HTTPException(404, f"no job {run_id!r}; GET /jobs lists them")
    return run


_Next = Callable[[Request], Awaitable[Response]]


class _Guard:
    """ASGI middleware: the checks of `_refusal`, before any route runs.

    They are: the Host check of a server without a token, the cross-site check of requests
    that change jobs, and the body size limit. A token-less server listens on loopback only,
    but a web page the user opens can still reach it through DNS rebinding (its own name,
    re-resolved to 127.0.0.1), submit jobs and read runs; such a request carries the page's
    name in ``Host``.
    """

    def __init__(self, app: ASGIApp, *, loopback_only: bool) -> None:
        self.app, self.loopback_only = app, loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = _refusal(headers, self.loopback_only, scope["method"])
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await JSONResponse({"detail": refusal[1]}, status_code=refusal[0])(scope, receive, send)


def _refusal(headers: dict[bytes, str], loopback_only: bool, method: str) -> tuple[int, str] | None:
    """(status, one-line reason) when a request is refused before routing, else None."""
    host = headers.get(b"host", "")
    if loopback_only and not _loopback_host(host):
        return 400, (
            f"Host {host!r} is not a loopback name; without --token this server answers only "
            "requests to localhost/127.0.0.1 (start it with --token to serve other names)"
        )
    if method not in _SAFE_METHODS and _cross_site(headers, host):
        return 403, (
            "a request from another site's page may not change jobs (cross-site request); "
            "submit and cancel from a client or from this server's own pages"
        )
    length = headers.get(b"content-length")
    if length is None and b"transfer-encoding" in headers:
        return 411, "send the body with a Content-Length header"
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
        return 413, f"request body of {length} bytes; at most {MAX_BODY} are accepted"
    return None


def _cross_site(headers: dict[bytes, str], host: str) -> bool:
    """Whether a browser sent this request from a page of another origin.

    Why: a page the user opens elsewhere can POST to a server on 127.0.0.1 (a form, or a fetch
    in no-cors mode), and the Host check cannot tell; browsers say where a request comes from
    in ``Origin`` and ``Sec-Fetch-Site``, which a page cannot forge. Clients such as httpx or
    curl send neither, and pass.
    """
    origin = headers.get(b"origin")
    if origin is not None and urlsplit(origin).netloc != host:
        return True  # "null" (a sandboxed page, a file) has no netloc: refused too
    return headers.get(b"sec-fetch-site", "same-origin") not in ("same-origin", "none")


def _loopback_host(host: str) -> bool:
    """Whether a ``Host`` header (``name[:port]``) names this machine's loopback."""
    try:
        name = urlsplit(f"//{host}").hostname
    except ValueError:
        return False
    return bool(name) and _is_loopback(str(name))


def _bearer_check(token: str) -> Callable[[Request, _Next], Awaitable[Response]]:
    """Middleware answering 401 unless the request carries the token.

    Clients send ``Authorization: Bearer token``. A browser cannot add that header, so it
    signs in once with ``GET /?token=...``: the answer sets the token as a cookie (HttpOnly,
    SameSite=Strict: another site's page cannot send it) and redirects to the same address
    without the token, so it stays out of the address bar and history.
    """
    async def check(request: Request, call_next: _Next) -> Response:
        header, cookie = request.headers.get("authorization"), request.cookies.get(TOKEN_COOKIE)
        scheme, _, given = (header or "").partition(" ")  # the scheme is case-insensitive
        if (scheme.lower() == "bearer" and _same(given, token)) or _same(cookie, token):
            return await call_next(request)
        if request.method == "GET" and _same(request.query_params.get("token"), token):
            response = RedirectResponse(str(request.url.remove_query_params("token")), 303)
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
            return response
        return JSONResponse(
            {"detail": "missing or wrong token: send 'Authorization: Bearer <token>' (a "
                       "browser: open /?token=<token> once)"},
            status_code=401, headers={"WWW-Authenticate": "Bearer"},
        )  # fmt: skip

    return check


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


async def _follow(
    store: RunStore,
    run_id: str,
    path_of: Callable[[], Path | None],
    follow: bool,
    project: Callable[[bytes], bytes | None] | None,
    *,
    partial: bool,
) -> AsyncIterator[bytes]:
    """Complete lines of a growing file; with ``follow``, until the run is in a final state.

    ``partial`` (logs): a line over `MAX_LINE` is cut into pieces and a last line without its
    newline is sent at the end; otherwise (JSONL) such lines are dropped, as not yet records.
    """
    offset, pending, skipping = 0, b"", False
    while True:
        poll = functools.partial(_poll, store, run_id, path_of, offset, follow=follow)
        done, chunk = await in_thread(poll)
        offset += len(chunk)
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        if skipping and lines:  # the end of a dropped overlong line
            lines, skipping = lines[1:], False
        if len(pending) > MAX_LINE:
            if partial:
                lines.append(pending)  # a log: sent in pieces
            else:
                skipping = True  # a JSONL record: dropped, up to its end
            pending = b""
        for line in lines:
            out = project(line) if project is not None else line
            if out is not None:
                yield out + b"\n"
        if not chunk and done:
            if partial and pending:
                yield pending + b"\n"
            return
        if not chunk:
            await asyncio.sleep(FOLLOW_POLL_S)


def _poll(
    store: RunStore,
    run_id: str,
    path_of: Callable[[], Path | None],
    offset: int,
    *,
    follow: bool,
) -> tuple[bool, bytes]:
    """Whether the run has ended, and the file's bytes from ``offset``.

    The state is read first, so no line written before the run ended is missed. Blocking (a
    database read, file reads): `_follow` calls it in a worker thread. On the event loop, a
    followed log waited there for a database lock, and so did every request.
    """
    done = not follow or _finished(store, run_id)
    path = path_of()
    return done, _read_from(path, offset) if path is not None else b""


def _finished(store: RunStore, run_id: str) -> bool:
    run = store.get_run(run_id)
    return run is None or run["status"] in TERMINAL


def _read_from(path: Path, offset: int) -> bytes:
    with contextlib.suppress(OSError), path.open("rb") as f:
        f.seek(offset)
        return f.read(1 << 20)
    return b""
