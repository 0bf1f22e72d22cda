"""`DockerSandbox`: one hardened container with a warm in-container code server.

Layout of a container::

    PID 1  docker-init (keeper uid)  ->  cat, reading the host's lifeline (keeper uid)
    code server (code uid; started by docker exec, speaks JSON lines over the exec stream)
       -> the code of each call (code uid), forked by the server

The keeper and the code have different uids, so the code cannot signal the keeper. The host
never trusts the server to stop: each call has a host-side deadline (timeout + grace) after
which the host runs ``kill -9 -1`` as the code uid through ``docker exec`` and restarts the
server; if even that fails the container is replaced and the call is an ``infra_error``.

The keeper's stdin is the lifeline: the sandbox's process holds the one attached end, so the
container stops, and the daemon removes it, as soon as that process ends, however it ends.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentgym._errors import SandboxError

from . import _reap
from ._channel import ChannelClosed, ChannelDeadline, ServerChannel, close_stream
from ._client import import_docker
from ._config import (
    DEFAULT_IMAGE,
    DockerSandboxConfig,
    check_image,
    docker_config,
    missing_image_fix,
)
from ._hosts import DockerHost
from ._protocol import (
    Files,
    SandboxBase,
    check_call_args,
    check_relative,
    check_timeout,
    language_argv,
    running_call,
    to_bytes,
)
from ._result import ExecResult, ExecStatus

log = logging.getLogger("agentgym.sandboxes")
#: The keeper reads its stdin until EOF, which comes when the lifeline (`_attach_lifeline`)
#: closes: a process killed with -9, or by a SIGTERM it has no handler for (no atexit hook
#: runs), left its containers running until the next pool start or ``sandbox prune``.
KEEPER_CMD = ["cat"]
CLEAN_TIMEOUT_S = 10.0  # the server's clean-up (reset, or a call's wipe): past it, reset hard
#: ``containers.create`` options of the lifeline: open stdin, closed once its one attached
#: client goes (docker-py sets StdinOnce for a non-detached create), and the container
#: removed by the daemon once it stops.
LIFELINE_OPTIONS = {"stdin_open": True, "detach": False, "auto_remove": True}


@dataclass(frozen=True)
class Snapshot:
    """A fork point: the files of a sandbox's work dir (a tar), not its processes.

    Restore it into any number of sandboxes (``sandbox.restore(snap)`` or
    ``pool.lease(snapshot=snap)``) so every rollout of a group starts from the same files, or
    so a verifier checks a copy of an episode's final state with none of the agent's processes
    alive. The Python session's variables are not part of a snapshot.
    """

    tar: bytes
    source: str  # short id of the container it was taken from

    @property
    def size(self) -> int:
        """Size of the tar in bytes."""
        return len(self.tar)


class DockerSandbox(SandboxBase):
    r"""A hardened Docker container that runs code through a warm in-container server.

    Example::

        with DockerSandbox() as sb:                     # image: DEFAULT_IMAGE
            r = sb.run("x = 6 * 7\nprint(x)")
            assert r.stdout == "42\n" and r.status == "ok"
            sb.run("print(x + 1)").stdout                # '43\n': the session persists

    ``config`` holds every hardening knob (`DockerSandboxConfig`); ``labels`` are added to the
    ownership labels. ``host`` says which daemon runs it (default: the environment's);
    ``client``, a connected docker-py client of that host, saves a connection. The container
    starts on ``start()``, on entering the context, or on the first call. Calls on one sandbox
    are serialised (a lock); use a `SandboxPool` for parallelism.
    """

    def __init__(self, image: str = DEFAULT_IMAGE, config: DockerSandboxConfig | None = None,
                 *, labels: Mapping[str, str] | None = None, client: Any = None,
                 host: DockerHost | None = None) -> None:
        self.image = check_image(image)
        self.config = docker_config(config)
        self.host = host or DockerHost()
        """The daemon the container runs on."""
        self._labels = dict(labels or {})
        self._client = client
        self._container: Any = None
        self._lifeline: Any = None  # the attached stdin of the keeper (docker-py's socket)
        self._channel: ServerChannel | None = None
        self._lock = threading.RLock()
        self._closed = False  # close() ran: calls are refused until an explicit start()
        self._busy = False  # a call holds the code server now (`interrupt` kills only then)
        self._killed = False  # that call's code was killed from outside already
        self.needs_recycle = False
        """True after a host-side intervention or a backend failure (pools replace it)."""
        self.left_behind: str | None = None
        """Id (or name) of a container `close` could not remove (its daemon did not answer): whoever
        reaches the daemon later should remove it (pools do when the host is back)."""

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def container_id(self) -> str | None:
        """The container's id once started."""
        return self._container.id if self._container is not None else None

    @property
    def expiring(self) -> bool:
        """True once a tenth of ``config.max_lifetime_s`` is left (pools replace it then).

        Past its expiry any agentgym reaper may remove the container, live owner or not.
        """
        lifetime = self.config.max_lifetime_s
        container = self._container
        expiry = _reap.expires_at(container.labels) if container is not None else None
        return (lifetime is not None and expiry is not None
                and time.time() > expiry - lifetime / 10)

    def start(self) -> DockerSandbox:
        """Create the container and start its code server (idempotent; reopens a closed one)."""
        with self._lock:
            self._closed = False
            self._ensure_started()
        return self

    def _ensure_started(self) -> None:
        """`start` for the sandbox's own calls, resets and replacements: it never reopens.

        ``close`` marks the sandbox closed before it waits for the lock, so a call or reset
        holding the lock may see the mark only now; reopening here undid that close, and the
        next call started a container nobody removed before exit.
        """
        self._refuse_if_closed("the container's start")
        if self._container is None:
            self._create_container()
        if self._channel is None or not self._channel.is_open:
            self._open_server()

    def _create_container(self) -> None:
        cfg = self.config
        if self._client is None:
            self._client = self.host.connect()
        self._remove_left_behind()  # its daemon answers again
        loosened = cfg.loosened()
        if loosened:
            log.warning("sandbox hardening loosened explicitly: %s", ", ".join(loosened))
        docker = import_docker()
        name = f"agentgym-{uuid.uuid4().hex}"  # to remove it even if the create's reply is lost
        try:  # create + start, not run: run would try to pull a missing image
            container = self._client.containers.create(
                self.image, KEEPER_CMD, name=name, **container_options(cfg, self._labels),
                **LIFELINE_OPTIONS)
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(f"image {self.image!r} not found on host {self.host.name!r}: "
                               f"{missing_image_fix(self.image)}") from exc
        except docker.errors.APIError as exc:  # the daemon answered: it made nothing
            raise SandboxError(f"cannot create a container from {self.image!r}: {exc}") from exc
        except Exception as exc:
            # No answer (a timeout under load): the daemon may have made it all the same, and
            # nobody knew its id; never started, it outlived the process. Removed by name now;
            # one the daemon does not answer for stays `left_behind`.
            self.left_behind = name
            self._remove_left_behind()
            raise SandboxError(f"cannot create a container from {self.image!r}: {exc}") from exc
        self._container = container
        _reap.track(self)
        try:
            self._attach_lifeline()
            container.start()
        except Exception as exc:
            # removed, not closed: closing refused every later call of a sandbox the user
            # never closed, after one passing daemon failure
            self._remove_container()
            raise SandboxError(f"cannot start a container from {self.image!r}: {exc}") from exc

    def _attach_lifeline(self) -> None:
        """Attach to the keeper's stdin before it starts, and keep the connection open.

        Why not a signal handler: the user's process may have its own, and SIGKILL has none.
        The kernel closes the connection whenever this process ends (a forked child closes
        its copy at the fork, `_reap`; an exec'd one never has it: sockets are not inherited
        across exec).
        """
        self._lifeline = self._client.api.attach_socket(
            self._container.id, params={"stdin": 1, "stream": 1})

    def _open_server(self) -> None:
        """Start a code server (it wipes nothing: `reset` asks the new one to, and checks)."""
        cfg = self.config
        channel = ServerChannel(self._client.api, self._container.id,
                                f"{cfg.code_uid}:{cfg.code_uid}", cfg.workdir, base_env(cfg))
        try:
            channel.open()
        except Exception as exc:
            channel.close()
            raise SandboxError(f"the code server did not start in {self._container.short_id}: "
                               f"{exc}") from exc
        self._channel = channel

    def _open_channel(self) -> ServerChannel:
        """The code server's channel; raises `SandboxError` when there is none.

        `start` opens it, but a failed recovery (`_kill_code_processes` followed by a failed
        `_open_server`) or `close` leaves the sandbox without one.
        """
        if self._channel is None:
            raise SandboxError("the sandbox has no code server channel (not started, closed, "
                               "or a recovery failed)")
        return self._channel

    def reset(self, hard: bool = False) -> None:
        """Kill every code process, empty the work dir, /tmp and /dev/shm, drop the session.

        The default asks the server to do it (a few ms; the server is non-dumpable, so the
        code cannot have tampered with it). ``hard=True`` (and any failure of the soft path)
        kills every process of the code uid from outside, server included, and starts a new
        server; if that fails too, the container is replaced.
        """
        with self._lock:
            self._refuse_if_closed("reset")
            if self._container is None:
                self._ensure_started()
                return
            if not hard and self._soft_reset():
                return
            try:
                self._kill_code_processes()
                self._open_server()
                clean = self._soft_reset()  # the new server wipes, and says what is left
            except Exception:
                clean = False
            if not clean:
                self._replace_container()

    def _soft_reset(self) -> bool:
        """Ask the server to reset; True when it says everything is clean again."""
        try:
            reply = self._open_channel().request({"op": "reset"}, CLEAN_TIMEOUT_S)
        except Exception as exc:
            log.debug("soft reset of %s failed: %s", self._container.short_id, exc)
            return False
        if not reply.get("ok"):
            log.debug("soft reset of %s left %s", self._container.short_id, reply.get("left"))
        return bool(reply.get("ok"))

    def close(self) -> None:
        """Remove the container (idempotent); later calls raise `SandboxError`.

        A call running now (another thread's) is killed first and returns ``infra_error``:
        waiting for it held ``close`` (a pool's too) for the call's whole timeout, and a
        call let in after it started a new container nobody would remove before exit.
        """
        self._closed = True
        self.interrupt()
        with self._lock:
            self._remove_container()
            if self.left_behind is None:  # else the exit hook's close tries it again
                _reap.untrack(self)

    def _refuse_if_closed(self, what: str) -> None:
        if self._closed:
            raise SandboxError(f"this DockerSandbox is closed (its container is removed); "
                               f"{what} did not run: use a new one, or start() it again")

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _remove_container(self) -> bool:
        """Close the channel and force-remove the container, if any (never raises).

        A container an earlier removal left behind is tried again first. True when the
        container was gone already, or its removal in progress (see `_replace_container`).
        """
        self._drop_channel()
        self._remove_left_behind()
        container, self._container = self._container, None
        gone = False
        if container is not None:
            try:
                container.remove(force=True)
            except Exception as exc:  # already gone: fine; anything else: removed later
                gone = _gone(exc)
                if not gone:
                    self.left_behind = container.id
                log.debug("removing %s: %s", container.short_id, exc)
        lifeline, self._lifeline = self._lifeline, None
        if lifeline is not None:  # after the removal: its end stops a container left behind
            close_stream(lifeline)
        return gone

    def _remove_left_behind(self) -> None:
        """Remove the container `left_behind` names, once its daemon answers (never raises)."""
        if self.left_behind is None or self._client is None:
            return
        try:
            self._client.api.remove_container(self.left_behind, force=True)
        except Exception as exc:
            if not _gone(exc):
                log.debug("removing %s again: %s", self.left_behind[:12], exc)
                return
        self.left_behind = None

    def interrupt(self) -> None:
        """Kill the code of the call running now, from outside, while that call holds the sandbox.

        Calls are serialised by a lock, so this is the only way to reach a running one (a
        cancelled episode's, say). That call sees its server die, restarts it and returns an
        ``error``; the sandbox is marked for recycling. With no call running it does nothing
        (the next call runs as usual). Never raises.
        """
        if not self._busy or self._killed:
            # No call runs: killing would only take down the idle code server, and the next
            # call (which ran nothing yet) came back as the code's `error`. A call already
            # killed is recovering: a second kill would hit the server it restarts.
            return
        self._kill_this_call()

    def _kill_this_call(self) -> None:
        """``kill -9 -1`` as the code uid from outside, for the call running now."""
        self._killed = True  # seen by the call once its container started, if none yet
        container = self._container
        if container is None:
            return
        self.needs_recycle = True
        uid = self.config.code_uid
        try:
            container.exec_run(["sh", "-c", "kill -9 -1"], user=f"{uid}:{uid}")
        except Exception as exc:  # the container is gone: the running call fails on its own
            log.debug("interrupting %s: %s", container.short_id, exc)

    def _kill_code_processes(self) -> None:
        """``kill -9 -1`` as the code uid, from outside the server (it dies too)."""
        self._drop_channel()
        uid = self.config.code_uid
        self._container.exec_run(["sh", "-c", "kill -9 -1"], user=f"{uid}:{uid}")

    def _replace_container(self) -> bool:
        """Remove the container and start a new one; True when the old one was gone already.

        Gone already means removed (or being removed) by someone else when this removal came:
        from outside (``docker rm -f``, a reaper), or by the daemon once the container stopped
        (``auto_remove``). The code can do neither: it cannot stop its container (the keeper
        is another uid), so a recovery may count this as the container lost.
        """
        self.needs_recycle = True
        gone = self._remove_container()
        self._ensure_started()
        return gone

    # -- calls ------------------------------------------------------------------------------
    def run(self, code: str, language: str = "python", stdin: str | bytes | None = None,
            files: Files | None = None, timeout: float | None = None, *,
            session: bool | None = None, end_session: bool = False,
            fresh_workdir: bool = False) -> ExecResult:
        """Run ``code``; Python runs in the session unless ``session=False`` (see config).

        ``end_session``: end the Python session (its threads, every process the code left)
        before the call, so nothing of the code runs beside it (see `Sandbox`).
        ``fresh_workdir`` (verify asks for it): besides, empty the work dir, /tmp and /dev/shm
        and restore the work dir's mode first, in the same request, so the call sees nothing
        earlier calls left (`reset` without its round trip). If that cannot be done even
        after a hard reset, the call is an ``infra_error`` and nothing runs.
        """
        check_call_args("code", code, stdin, files)
        argv = language_argv(language, code)
        ends = end_session or fresh_workdir
        req: dict[str, Any] = {"op": "exec", "argv": argv, "end_session": ends}
        if argv is None:
            use_session = self.config.python_session if session is None else session
            req = {"op": "run", "code": code, "session": use_session and not fresh_workdir,
                   "end_session": ends}
        if fresh_workdir:
            req["wipe"] = True
        return self._call(req, stdin, files, timeout)

    def exec(self, argv: Sequence[str], stdin: str | bytes | None = None,
             files: Files | None = None, timeout: float | None = None) -> ExecResult:
        """Run ``argv`` (looked up on the image's PATH) in the work dir."""
        check_call_args("argv", argv, stdin, files)
        return self._call({"op": "exec", "argv": [str(a) for a in argv]}, stdin, files, timeout)

    def _call(self, req: dict[str, Any], stdin: str | bytes | None, files: Files | None,
              timeout: float | None) -> ExecResult:
        timeout = check_timeout(self.config.default_timeout if timeout is None else timeout)
        for path in files or {}:
            check_relative(path)
        contents = {p: to_bytes(c) or b"" for p, c in (files or {}).items()}
        too_large = _too_large(contents, self.config)
        if too_large:  # sent whole in one request, it took the code server's memory
            return ExecResult("", f"sandbox: {too_large}\n", None, 0.0, ExecStatus.ERROR)
        req = {**req, "timeout": timeout, "limit": self.config.output_limit_bytes,
               "stdin": _b64(to_bytes(stdin)), "files": {p: _b64(c) for p, c in contents.items()}}
        started = time.monotonic()
        with self._lock:
            self._killed = False  # before the call can be killed: a kill from now on is its
            with running_call(self._kill_this_call):
                return self._call_locked(req, timeout, started)

    def _call_locked(self, req: dict[str, Any], timeout: float, started: float) -> ExecResult:
        """`_call` holding the sandbox, its kill registered for a cancel or `close`."""
        self._refuse_if_closed("the call")
        self._busy = True
        try:
            self._ensure_started()
            if self._killed:  # cancelled or closed while its container started
                return ExecResult.infra_failure(
                    "sandbox: the call was cancelled (or its sandbox closed) while the "
                    "container started; no code ran", time.monotonic() - started)
            reply = self._request(req, timeout)
            if "wipe_error" in reply:
                return self._after_wipe_error(req, timeout, started, reply["wipe_error"])
        except ChannelDeadline:
            return self._recover("timeout", started, timeout)
        except ChannelClosed as exc:
            return self._recover("closed", started, timeout, str(exc))
        except Exception as exc:
            self.needs_recycle = True
            return ExecResult.infra_failure(f"sandbox: {type(exc).__name__}: {exc}",
                                            time.monotonic() - started)
        except BaseException:  # Ctrl-C in a blocking call: the code must not run on,
            self._kill_this_call()  # and the next call be blamed for its time
            self._drop_channel()
            raise
        finally:
            self._busy = False
        return self._result(reply, started)

    def _request(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send a call and return its reply; one with ``wipe`` first waits for the clean-up.

        Why apart: the clean-up removes what an earlier call left, and the code spends far
        less time leaving it (300,000 folders: 2 s) than the clean-up takes (10 s). On the
        call's own clock, the next sample's runner timed out and a correct sample scored 0.
        So the clean-up has `CLEAN_TIMEOUT_S`; past it, or with the server dead in it (the
        memory limit full of the folders), the reply is a ``wipe_error`` (the caller resets
        hard, else replaces the container: the sample's code had not run yet), and
        the call's ``timeout`` starts once the server says the sandbox is clean.
        """
        channel = self._open_channel()
        if not req.get("wipe"):
            return channel.request(req, timeout + self.config.host_grace_s)
        try:
            reply = channel.request(req, CLEAN_TIMEOUT_S)
        except (ChannelDeadline, ChannelClosed) as exc:
            if self._killed or not self._still_running():  # interrupted, closed, or the
                raise  # container lost: the usual recovery says so, and nothing runs again
            return {"wipe_error": f"the clean-up unfinished ({exc})"}
        if not reply.get("wiped"):
            return reply
        return channel.next_reply(timeout + self.config.host_grace_s)

    def _after_wipe_error(self, req: dict[str, Any], timeout: float, started: float,
                          left: str) -> ExecResult:
        """Reset hard (a new server, else a new container), then send the call once more.

        For a ``fresh_workdir`` call the server could not clean the sandbox for. Never the
        call's own failure: what was left is an earlier call's doing, and judged
        code must not run in it (it would score the wrong sample). A deadline or a dead
        server during the second try is the call's, as for any call (the caller recovers).
        """
        self.needs_recycle = True
        try:
            self.reset(hard=True)
        except Exception as exc:
            why = f"left {left}; reset(hard=True) then failed: {type(exc).__name__}: {exc}"
        else:
            reply = self._request(req, timeout)
            if "wipe_error" not in reply:
                return self._result(reply, started)
            why = f"left {reply['wipe_error']} even after reset(hard=True)"
        return ExecResult.infra_failure(
            f"sandbox: the sandbox could not be cleaned before this call ({why}); nothing "
            "ran. Use a new sandbox (a SandboxPool replaces it)", time.monotonic() - started)

    def _result(self, reply: dict[str, Any], started: float) -> ExecResult:
        """The `ExecResult` of a run/exec reply."""
        if "input_error" in reply:  # e.g. a file path outside the work dir: the caller's doing
            return ExecResult("", f"sandbox: {reply['input_error']}\n", None,
                              time.monotonic() - started, ExecStatus.ERROR)
        if "server_error" in reply:  # the server itself failed: infrastructure, not the code
            self.needs_recycle = True
            return ExecResult.infra_failure(f"sandbox server: {reply['server_error']}",
                                            time.monotonic() - started)
        return ExecResult(reply["stdout"], reply["stderr"], reply["exit_code"],
                          reply["duration"], ExecStatus(reply["status"]), reply["truncated"])

    def _recover(self, what: str, started: float, timeout: float, detail: str = "") -> ExecResult:
        """The server missed its deadline or died: kill the code from outside, restart.

        Whose failure the call is: the code's (``timeout``, or ``error`` when the server died)
        while the container runs, also when the restart inside it fails and a new container
        replaces it. Code can make that restart fail (every pid or the memory limit taken
        when the server dies, so no ``docker exec`` can start); as ``infra_error`` the episode
        would be dropped, not scored. Only a container that is gone, or that cannot be
        replaced (the daemon failed), is infrastructure.

        "Runs" is not one read of its state: the daemon reports a container that ``docker rm
        -f`` killed as "running" until it has handled the exit (the first read after such a
        removal mostly does; under load a read after the failed restart did too, and the call
        was scored as the code's ``error``). Two answers settle it: the daemon's log of a
        "kill" of the container (``docker kill``, ``stop``, ``rm -f``: `_killed_by_docker`),
        and the replacement's own removal: a container found gone or already being removed
        was not the code's doing.
        """
        self.needs_recycle = True
        if self._closed:  # close() killed this call: not the code's doing, and nothing to restart
            return ExecResult.infra_failure("sandbox: closed while this call ran (its pool or "
                                            "owner closed it); the call's outcome is unknown",
                                            time.monotonic() - started)
        restarted = False
        try:
            running = self._container_running()
        except import_docker().errors.NotFound:  # auto_remove: a stopped container is removed
            running, detail = False, f"{detail}; the container is gone (stopped and removed)"
        except Exception as exc:
            running, detail = False, f"{detail}; its state unreadable: {exc}"
        if running:
            try:
                self._kill_code_processes()
                self._open_server()
                restarted = True
            except Exception as exc:
                detail = f"{detail}; the server could not be restarted in it: {exc}"
                running = self._still_running()  # read again: stopped or removed since
                if running and self._killed_by_docker():  # before our own removal's kill
                    running, detail = False, (f"{detail}; it read \"running\" but Docker had "
                                              "killed it (docker kill, stop or rm -f)")
        if not restarted:
            try:
                gone = self._replace_container()
            except Exception as exc:
                return ExecResult.infra_failure(
                    f"sandbox: container lost ({detail}; replacement failed: {exc})",
                    time.monotonic() - started,
                )
            if gone and running:
                running, detail = False, (f"{detail}; it read \"running\" but was being removed "
                                          "(from outside, or once it stopped)")
        elapsed = time.monotonic() - started
        if not running:
            return ExecResult.infra_failure(f"sandbox: container lost ({detail})", elapsed)
        note = "" if restarted else " (the server could not restart: the container was replaced)"
        if what == "timeout":
            return ExecResult("", f"sandbox: no reply within {timeout:g}s (+ grace); killed "
                              f"every code process from outside{note}\n", None, elapsed,
                              ExecStatus.TIMEOUT)
        return ExecResult("", "sandbox: the code server died during this call (killed by the "
                          "code?); every code process was killed and the Python session was "
                          f"lost{note}\n", None, elapsed, ExecStatus.ERROR)

    def _container_running(self) -> bool:
        if self._container is None:
            return False
        self._container.reload()
        return self._container.status == "running"

    def _killed_by_docker(self) -> bool:
        """Whether the daemon logged a "kill" of this container since it started (never raises).

        Why: after ``docker kill`` the daemon reports the container "running" until it has
        handled the exit, and with our removal ahead of its auto-removal nothing else tells
        the kill from code that broke its own server's restart. The code cannot cause this
        event: it has no Docker API, and the signals it sends inside are not the daemon's.
        Our own forced removal logs one too, so this is read before it. Both ends of the
        window are the daemon's clock: a remote host's is not ours.
        """
        container, client = self._container, self._client
        if container is None or client is None:
            return False
        try:
            started = _daemon_epoch(container.attrs["State"]["StartedAt"])
            now = _daemon_epoch(client.api.info()["SystemTime"])
            kills = list(client.api.events(  # the stream ends at `until`: read it to its end
                since=int(started), until=f"{now:.6f}", decode=True,
                filters={"container": container.id, "event": "kill"}))  # fmt: skip
            return bool(kills)
        except Exception as exc:  # unreadable: the state reads decide, as before
            log.debug("reading the events of %s: %s", container.short_id, exc)
            return False

    def _still_running(self) -> bool:
        """`_container_running`, False when its state cannot be read (it is being removed)."""
        try:
            return self._container_running()
        except Exception:
            return False

    # -- state fork -------------------------------------------------------------------------
    def snapshot(self, timeout: float = 60.0) -> Snapshot:
        """Tar of the work dir (files only; processes and the Python session excluded).

        Raises `SandboxError` when the server fails or misses ``timeout`` (seconds).
        """
        with self._lock:
            reply = self._state_request("snapshot", {"op": "tar"}, timeout)
            return Snapshot(base64.b64decode(reply["data"]), self._container.short_id)

    def restore(self, snapshot: Snapshot, timeout: float = 60.0) -> None:
        """Replace the work dir with ``snapshot``'s files; kills code processes first.

        Raises `SandboxError` when the server fails or misses ``timeout`` (seconds).
        """
        with self._lock:
            self._state_request(
                "restore", {"op": "untar", "data": base64.b64encode(snapshot.tar).decode()},
                timeout)

    def _state_request(self, what: str, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One tar/untar request; a dead or silent server is restarted, then `SandboxError`."""
        self._refuse_if_closed(what)
        self._ensure_started()
        try:
            reply = self._open_channel().request(req, timeout)
        except (ChannelDeadline, ChannelClosed) as exc:
            self._recover("closed", time.monotonic(), timeout, str(exc))
            raise SandboxError(f"{what} failed: {exc}") from exc
        if "server_error" in reply:
            raise SandboxError(f"{what} failed: {reply['server_error']}")
        return reply


def _too_large(contents: Mapping[str, bytes], cfg: DockerSandboxConfig) -> str | None:
    """Why ``contents`` cannot be sent: a file over ``fsize_mb``, or all over the work dir.

    Checked on the host: the server reads a call's files whole, and 100 MiB of them took its
    memory; the call came back as the code's failure ("killed by the code?") with no code run.
    """
    sizes = {path: len(content) for path, content in contents.items()}
    for path, size in sizes.items():
        if size > cfg.fsize_mb << 20:
            return (f"file {path!r} is {size / 2**20:.1f} MiB, over the sandbox's largest file "
                    f"(fsize_mb={cfg.fsize_mb}); send less, or raise fsize_mb")
    if sum(sizes.values()) > cfg.workdir_size_mb << 20:
        return (f"the files are {sum(sizes.values()) / 2**20:.1f} MiB in all, over the work "
                f"dir's {cfg.workdir_size_mb} MiB (workdir_size_mb); send less, or raise it")
    return None


def _gone(exc: BaseException) -> bool:
    """Whether a container removal failed only because the container is gone, or going.

    Why the 409: with ``auto_remove`` the daemon removes a stopped container itself, and a
    ``remove`` meanwhile is refused as "removal already in progress"; as a failure it marked
    the container `left_behind`.
    """
    errors = import_docker().errors
    return isinstance(exc, errors.NotFound) or (
        isinstance(exc, errors.APIError) and exc.status_code == 409
    )


def _daemon_epoch(stamp: str) -> float:
    """Seconds since the epoch of a Docker timestamp (RFC 3339 with nanoseconds)."""
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", stamp)).timestamp()


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def base_env(cfg: DockerSandboxConfig) -> dict[str, str]:
    """The environment of the code: a fixed minimal set plus ``cfg.environment``."""
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": cfg.workdir, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            **cfg.environment}


def container_options(cfg: DockerSandboxConfig, labels: Mapping[str, str]) -> dict[str, Any]:
    """``containers.create``/``run`` keyword arguments for ``cfg`` (the hardening, in one place)."""
    docker = import_docker()
    mib = 1024 * 1024
    work_flags = "exec" if cfg.workdir_exec else "noexec"
    opts: dict[str, Any] = dict(
        user=f"{cfg.keeper_uid}:{cfg.keeper_uid}",
        init=True,
        network_mode=cfg.network_mode,
        read_only=cfg.read_only_root,
        tmpfs={
            cfg.workdir: f"rw,{work_flags},nosuid,nodev,size={cfg.workdir_size_mb}m,"
                         f"uid={cfg.code_uid},gid={cfg.code_uid},mode=700",
            "/tmp": f"rw,noexec,nosuid,nodev,size={cfg.tmp_size_mb}m,mode=1777",
        },
        mem_limit=cfg.mem_limit_mb * mib,
        memswap_limit=cfg.mem_limit_mb * mib,
        nano_cpus=int(cfg.cpus * 1e9),
        pids_limit=cfg.pids_limit,
        cap_drop=["ALL"] if cfg.drop_all_capabilities else None,
        cap_add=list(cfg.cap_add) or None,
        security_opt=["no-new-privileges"] if cfg.no_new_privileges else None,
        ulimits=[
            docker.types.Ulimit(name="nofile", soft=cfg.nofile, hard=cfg.nofile),
            docker.types.Ulimit(name="fsize", soft=cfg.fsize_mb * mib, hard=cfg.fsize_mb * mib),
            docker.types.Ulimit(name="core", soft=0, hard=0),
        ],
        ipc_mode="private",
        shm_size=cfg.shm_size_mb * mib,
        working_dir=cfg.workdir,
        environment=base_env(cfg),
        labels=_reap.ownership_labels(dict(labels), cfg.max_lifetime_s),
        log_config=docker.types.LogConfig(type="none"),
    )
    if cfg.runtime:
        opts["runtime"] = cfg.runtime
    return {k: v for k, v in opts.items() if v is not None}
