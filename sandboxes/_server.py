"""In-container code server: runs as the code uid, sent to the container as ``python3 -s -c``.

Stand-alone on purpose (standard library only, Python >= 3.9): it must run in any image with a
``python3``. The host starts it with ``docker exec`` and talks over that exec's stdin/stdout,
one JSON object per line each way, so a warm call costs a fork, not a ``docker exec``.

Requests (``op``): ``run`` (Python code, fresh or in the session), ``exec`` (an argv), ``tar``
(the work dir as base64 tar), ``untar`` (replace the work dir), ``ping``. Every run/exec reply
carries ``stdout, stderr, exit_code, duration, status, truncated``.

Process model::

    server S (this file) -- reporter C per fresh call (fork) -- the code G (fork of C)
                         -- session kernel K (fork of S, holds the session's globals)
                               per cell: K forks K'; K' runs the cell, replies and becomes
                               the kernel (S then ends K); if K' dies first, K says so, stays.

The code never holds a fd of the harness except, in a session, the kernel socket its own
process must keep to be the next kernel: G has only fds 0-2 (C keeps the control pipe), and
S reads the kernel socket as untrusted (`_Replies`). After every call S kills every process of
its uid except itself and the current kernel (scanning /proc until none is left), so detached
``setsid`` children do not survive. A request with ``end_session`` ends the kernel first, so
nothing the code left running (a session thread) runs beside it; one with ``wipe`` also
empties the work dir, /tmp and /dev/shm first (as ``reset``): verification asks for both.
Timeouts and the output cap are enforced here, inside the container.
"""

import base64
import builtins
import io
import json
import mmap
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import traceback

WORKDIR = sys.argv[1] if len(sys.argv) > 1 else "/work"
# /dev/mqueue: POSIX message queues are files there, and outlive every process like /tmp's.
WIPE = ("/tmp", "/dev/shm", "/dev/mqueue", WORKDIR)
KILL_WAIT_S = 2.0
FORK_ROOM_S = 2.0  # how long a fork with no code left to run waits for pids to come free
CTL_CAP = 1 << 16  # bytes of unparsed control data kept (a reply line is ~100)


def _oom_kills():
    """The container's kernel OOM-kill counter (cgroup v1 or v2), or -1 if unreadable."""
    for path in ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"):
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except OSError:
            continue
    return -1


def _harden_self():
    """Reap orphans (subreaper) and become non-dumpable (forks inherit it).

    Non-dumpable: the code, though it has the same uid, can neither ptrace this server nor
    open its /proc files (fds, memory).
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    except Exception:
        pass


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_strays(keep):
    """SIGKILL every process of our uid outside ``keep`` until none is left."""
    uid = os.getuid()
    for _ in range(200):
        found = 0
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in keep:
                continue
            try:
                if not _holds_code(name, uid):
                    continue
                os.kill(int(name), signal.SIGKILL)
                found += 1
            except (OSError, IndexError):
                continue
        _reap()
        if not found:
            return
        time.sleep(0.001)


def _fork_when_room():
    """``os.fork()``, retried for up to ``FORK_ROOM_S`` while killed code still holds pids.

    Called when no code may run (no session kernel): every process of the code uid is swept
    first. A killed process with thousands of threads frees its pids only as they exit, which
    on a loaded machine outlasts a sweep; the first call after the host restarted a server the
    code had killed then failed to fork and came back as infra_error. Past the deadline the
    failure is the sandbox's.
    """
    deadline = time.monotonic() + FORK_ROOM_S
    while True:
        try:
            return os.fork()
        except OSError:
            if time.monotonic() > deadline:
                raise
            _kill_strays({os.getpid()})
            time.sleep(0.01)


def _state_uid(pid):
    """(is_zombie, real uid, threads) of a process, from /proc/PID/status (readable for any)."""
    zombie, real, threads = False, None, 1
    with open(f"/proc/{pid}/status", "rb") as fh:
        for line in fh:
            if line.startswith(b"State:"):
                zombie = line.split()[1] == b"Z"
            elif line.startswith(b"Uid:"):
                real = int(line.split()[1])
            elif line.startswith(b"Threads:"):
                threads = int(line.split()[1])
                break
    return zombie, real, threads


def _holds_code(pid, uid):
    """Whether process ``pid`` of ``uid`` still runs code: alive, or a zombie with threads.

    A process whose main thread exited (``pthread_exit``) shows state Z while its other
    threads run on; skipped as a zombie, it would outlive every sweep, the next lease's
    included, and keep the pids limit full.
    """
    zombie, real, threads = _state_uid(pid)
    return real == uid and (not zombie or threads > 1)


def _wipe():
    """Empty every place the code can leave state in for the next lease; return what is left.

    Files (the WIPE dirs, whatever their modes) and the container's System V IPC objects:
    shared memory, message queues and semaphores outlive the processes that made them, so an
    episode could pass data to a later one or leave the memory limit full for it. Returns
    '' when the work dir is usable again and the dirs are empty, else what is not (see
    `_left_after_wipe`): a caller must not run judged code in a sandbox it could not clean.
    """
    try:
        os.chmod(WORKDIR, 0o700)  # the code owns it: a 000 work dir must not stop the wipe
    except OSError:
        pass
    for root in WIPE:
        try:
            names = os.listdir(root)
        except OSError:  # /dev/mqueue is missing in some runtimes
            continue
        for name in names:
            path = os.path.join(root, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    _remove_tree(path)
                else:
                    os.unlink(path)
            except OSError:
                pass
    _remove_sysv_ipc()
    return _left_after_wipe()


def _left_after_wipe():
    """What `_wipe` could not restore, as one line ('' when nothing).

    The work dir must be ours to enter and write (the code can chmod it, not chown it), and
    the WIPE dirs empty of the code's files (a /tmp it filled made pytest's temp dir fail).
    """
    left = []
    if not os.access(WORKDIR, os.R_OK | os.W_OK | os.X_OK):
        left.append(f"{WORKDIR} cannot be entered")
    uid = os.getuid()
    for root in WIPE:
        try:
            with os.scandir(root) as entries:
                names = [e.name for e in entries if e.stat(follow_symlinks=False).st_uid == uid]
        except OSError:  # /dev/mqueue may be missing; an unreadable WORKDIR is named above
            continue
        if names:
            left.append(f"{root} still holds {', '.join(sorted(names)[:3])}")
    return "; ".join(left)


def _remove_sysv_ipc():
    """IPC_RMID every System V shared memory segment, message queue and semaphore set.

    The container has its own IPC namespace, so all of them are the code's. A segment still
    attached goes once its last process detaches (every code process is dead by now).
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except Exception:
        return
    ipc_rmid = 0
    remove = {"shm": lambda i: libc.shmctl(i, ipc_rmid, None),
              "msg": lambda i: libc.msgctl(i, ipc_rmid, None),
              "sem": lambda i: libc.semctl(i, 0, ipc_rmid)}
    for kind, rm in remove.items():
        try:
            with open(f"/proc/sysvipc/{kind}") as fh:
                ids = [int(line.split()[1]) for line in list(fh)[1:] if line.strip()]
        except (OSError, ValueError, IndexError):
            continue
        for ident in ids:
            rm(ident)


def _remove_tree(path):
    """Remove the directory ``path`` and everything in it, however the code left it.

    Modes first (`_chmod_tree`), then ``rmtree``. A tree deeper than Python recurses (the
    code made 1,900 nested folders: ``rmtree`` raised RecursionError, the reset failed and
    the container was replaced, each episode) or than a path can name is left to coreutils,
    which walk any depth.
    """
    try:
        _chmod_tree(path)
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        pass
    if os.path.lexists(path):
        for argv in (["chmod", "-R", "u+rwx", "--", path], ["rm", "-rf", "--", path]):
            try:
                subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=False)
            except OSError:  # an image without coreutils: the reset says what is left
                return


def _chmod_tree(path):
    """Make every directory under ``path``, ``path`` included, ours to list and empty.

    ``path`` too: a top-level directory the code made 000 (or r-x) would otherwise survive
    ``rmtree`` with its files, into the next lease. A loop, not a recursion: the code
    chooses the depth.
    """
    stack = [path]
    while stack:
        top = stack.pop()
        try:
            os.chmod(top, 0o700)
            with os.scandir(top) as entries:
                stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
        except OSError:
            pass


def _stdin_fd(data):
    if data is None:
        return os.open(os.devnull, os.O_RDONLY)
    fd = os.memfd_create("stdin")
    os.write(fd, base64.b64decode(data))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _close_fds(keep):
    """Close every fd from 3 up except those in ``keep``."""
    low = 3
    for fd in sorted(set(keep)) + [1 << 16]:
        os.closerange(low, fd)
        low = fd + 1


def _become(in_fd, out_w, err_w, keep=()):
    """In a fresh child: new session, fds 0/1/2 wired, every other fd closed, OOM-first."""
    os.setsid()
    for src, dst in ((in_fd, 0), (out_w, 1), (err_w, 2)):
        os.dup2(src, dst)
    _close_fds(keep)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass
    try:
        os.chdir(WORKDIR)
    except OSError as exc:  # fd 2 is the call's stderr: say why, not a silent exit 125
        os.write(2, _no_workdir(exc.strerror).encode())
        os._exit(125)


def _no_workdir(why):
    """The stderr line of a call that cannot start in the work dir (the code chmod'ed it)."""
    return (f"sandbox: cannot enter the work dir {WORKDIR} ({why}): code changed its "
            "permissions; nothing ran. reset() restores it (verify does so itself)\n")


def _exec_cell(code, g):
    """Run ``code`` in globals ``g``; return (exit_code, memory_error)."""
    exit_code, memory_error = 0, False
    try:
        exec(compile(code, "<code>", "exec"), g)
    except SystemExit as exc:
        c = exc.code
        exit_code = c if isinstance(c, int) else (0 if c is None else 1)
        if not isinstance(c, int) and c is not None:
            print(c, file=sys.stderr)
    except MemoryError:
        exit_code, memory_error = 1, True
        sys.stderr.write("MemoryError\n")
    except BaseException as exc:
        exit_code = 1
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    return exit_code, memory_error


def _fresh_globals():
    return {"__name__": "__main__", "__builtins__": builtins, "__doc__": None}


def _send(fd_or_sock, obj):
    data = (json.dumps(obj) + "\n").encode()
    if isinstance(fd_or_sock, socket.socket):
        fd_or_sock.sendall(data)
    else:
        os.write(fd_or_sock, data)


def _child_run(req, in_fd, out_w, err_w, ctl_w):
    """Body of a fresh child: fork the code's own process, report its end on ``ctl_w``, exit.

    The code runs in a grandchild that holds only fds 0-2, so nothing it writes can reach the
    server's control pipe. Its MemoryError comes back through an anonymous shared page (no fd).
    """
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the server's own stdio is the host's channel
            os.dup2(null, fd)
        _close_fds((in_fd, out_w, err_w, ctl_w))
        flag = mmap.mmap(-1, 1)
        pid = os.fork()
        if pid == 0:
            _become(in_fd, out_w, err_w)
            if req["op"] == "run":
                sys.stdin = io.TextIOWrapper(os.fdopen(0, "rb", closefd=False))
                code, mem = _exec_cell(req["code"], _fresh_globals())
                flag[0] = int(mem)
                os._exit(code & 0xFF)
            try:
                os.execvp(req["argv"][0], req["argv"])
            except OSError as exc:
                os.write(2, ("{}: {}\n".format(req["argv"][0], exc.strerror)).encode())
                os._exit(127)
            except ValueError as exc:  # a NUL byte in argv: LocalSandbox's words
                os.write(2, "sandbox: cannot run {!r:.80}: {}\n".format(req["argv"][0], exc)
                         .encode("utf-8", "replace"))
                os._exit(125)
        for fd in (in_fd, out_w, err_w):
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        _send(ctl_w, {"exit_code": _exit_code(status), "memory_error": bool(flag[0]),
                      "id": req.get("id")})
        os._exit(0)
    except BaseException as exc:
        # Silent, this was an `error` with nothing on stderr. Mostly a fork that found no pid
        # free: zombie children of the Python session hold them until the session ends.
        why = (f"sandbox: this call's process could not start ({type(exc).__name__}: {exc}); "
               "processes the code left (children of the Python session) may hold every "
               "pid: end the session with reset()\n")
        try:
            os.write(err_w, why.encode())
        except OSError:
            pass
        os._exit(125)


def _exit_code(status):
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _kernel(sock):
    """Session kernel loop. Each cell runs in a fork that becomes the kernel if it survives.

    The cell's fork holds the kernel socket (it is the next kernel) and nothing else of the
    harness; it replies itself once the cell is done. The old kernel only waits: if the fork
    dies first, it reports ``died`` and stays the kernel; otherwise the server ends it.
    """
    g = _fresh_globals()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 65536, 4)
        except OSError:
            os._exit(0)
        if not msg or len(fds) != 4:
            os._exit(0)
        req = json.loads(msg)
        try:
            pid = os.fork()
        except OSError as exc:
            # The session's own threads or children hold every pid: the code's doing. The
            # kernel ends (and its threads with it), so the next cell starts a new session.
            os.write(fds[2], (f"[sandbox] the Python session could not start this cell "
                              f"({exc.strerror}): its threads or processes hold every pid; "
                              f"the session ends\n").encode())
            os._exit(1)
        if pid == 0:
            code, mem = _cell_in_kernel(fds, g)
            _send(sock, {"exit_code": code, "memory_error": mem, "kernel": os.getpid(),
                         "id": req["id"]})
            continue
        for fd in fds:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        _send(sock, {"died": True, "exit_code": _exit_code(status), "kernel": os.getpid(),
                     "id": req["id"]})


def _cell_in_kernel(fds, g):
    """Run one cell with the call's fds as 0-2; afterwards 0-2 are /dev/null again."""
    in_fd, out_w, err_w, code_fd = fds
    with os.fdopen(code_fd, "rb") as fh:
        code = fh.read().decode("utf-8")
    os.setsid()
    for src, dst in ((in_fd, 0), (out_w, 1), (err_w, 2)):
        os.dup2(src, dst)
        os.close(src)
    stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(os.fdopen(0, "rb", closefd=False))
    result = _exec_cell(code, g)
    sys.stdin = stdin
    null = os.open(os.devnull, os.O_RDWR)  # fd 1 itself when the cell closed fd 1
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    if null > 2:
        os.close(null)
    # What the cell printed but could not write (it closed fd 1 or 2) is still buffered;
    # flushed at the next cell it went into that cell's output. Into /dev/null with it.
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    return result


class Server:
    """The request loop. Holds the session kernel's pid and control socket."""

    def __init__(self):
        self.kernel = None  # pid of the current session kernel
        self.ctl = None  # our end of the socket pair shared with the kernel lineage
        self.session_lost = False  # the next cell says its session is new (`_end_session`)
        self.inbox = b""

    # -- session kernel ------------------------------------------------------------------
    def _start_kernel(self):
        mine, theirs = socket.socketpair()
        try:
            pid = _fork_when_room()
        except OSError:
            mine.close()
            theirs.close()
            raise
        if pid == 0:
            try:
                mine.close()
                null = os.open(os.devnull, os.O_RDWR)
                _become(null, null, null, keep=(theirs.fileno(),))
                _kernel(theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.kernel, self.ctl = pid, mine

    def _drop_kernel(self):
        if self.ctl is not None:
            self.ctl.close()
        self.kernel, self.ctl = None, None

    def _end_session(self):
        """Kill the session kernel, its threads and children, and wait until they are gone."""
        kernel = self.kernel
        self._drop_kernel()
        self.session_lost = True
        if kernel is not None:
            try:
                os.kill(kernel, signal.SIGKILL)
                os.waitpid(kernel, 0)  # it is our child (or reparented to us, the subreaper)
            except OSError:
                pass
        _kill_strays({os.getpid()})

    def clean(self):
        """End the session and every process of the code, then `_wipe`; return what is left.

        '' when the sandbox is clean again. What ``reset`` and a ``wipe`` call do first.
        """
        self._end_session()
        return _wipe()

    def _kernel_alive(self):
        """Whether the kernel can take a cell: running, its main thread included."""
        if self.kernel is None:
            return False
        _reap()
        try:
            return _state_uid(self.kernel)[0] is False
        except OSError:
            return False

    # -- one call ------------------------------------------------------------------------
    def call(self, req):
        """Run one ``run``/``exec`` request; return the reply dict.

        ``wipe`` (verify asks for it): first end the session and every process of the code,
        and empty the work dir, /tmp and /dev/shm (the work dir's mode restored), so the call
        judges its own sample only, whatever earlier calls left; a ``wipe_error`` reply when
        that fails, and nothing runs.
        """
        started = time.monotonic()
        if req.get("wipe"):
            left = self.clean()  # the session ended too: no second end below
            if left:
                return {"wipe_error": left}
            # The clean-up was an earlier call's mess (300,000 folders take 10 s): the host
            # times it apart, and this call's clock starts now (see DockerSandbox._request).
            _write_reply({"wiped": True, "id": req.get("id")})
            started = time.monotonic()
        elif not os.access(WORKDIR, os.X_OK) and not (
                req["op"] == "run" and req.get("session") and self._kernel_alive()):
            # a live session (its cwd kept) can still run, and undo the chmod itself
            return {"stdout": "", "stderr": _no_workdir("permission denied"), "exit_code": 125,
                    "duration": time.monotonic() - started, "status": "error",
                    "truncated": False}
        for path, data in (req.get("files") or {}).items():
            try:
                _write_file(path, data)
            except (OSError, ValueError) as exc:  # the caller's files, not the server, failed
                return {"input_error": f"cannot write {path!r}: {type(exc).__name__}: {exc}"}
        limit = int(req["limit"])
        oom_before = _oom_kills()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_fd = _stdin_fd(req.get("stdin"))
        # nothing the code left running may run beside this call (a wipe ended it already)
        if req.get("end_session") and not req.get("wipe"):
            self._end_session()
        session = bool(req["op"] == "run" and req.get("session"))
        if session:
            note = self._send_cell(req, in_fd, out_w, err_w)
            ctl, child = self.ctl, None
        else:
            ctl, child, note = self._fork_fresh(req, in_fd, out_w, err_w)
        for fd in (in_fd, out_w, err_w):
            os.close(fd)
        replies = _Replies(ctl, req.get("id"), {os.getpid(), self.kernel})
        outs, msg, status = _pump(out_r, err_r, replies, started + float(req["timeout"]), limit)
        msg = self._settle(session, replies, child, msg, killed=status is not None)
        outs = _drain(out_r, err_r, outs, limit)
        exit_code = msg.get("exit_code") if msg else None
        if status is None:
            oom = msg and msg.get("memory_error") or _oom_kills() > oom_before >= 0
            status = "oom" if oom else ("ok" if exit_code == 0 else "error")
        return {
            "stdout": outs[0].decode("utf-8", "replace"),
            "stderr": note + outs[1].decode("utf-8", "replace"),
            "exit_code": exit_code, "duration": time.monotonic() - started, "status": status,
            "truncated": outs[2] or status == "output_limit",
        }

    def _send_cell(self, req, in_fd, out_w, err_w):
        """Hand a cell to the session kernel (started if needed); return a note or ''."""
        code = req["code"].encode("utf-8")  # before anything starts: it may not be text
        note = ""
        if not self._kernel_alive():
            if self.kernel is not None or self.session_lost:
                note = "[sandbox] the Python session was lost; this cell ran in a new one\n"
            if self.kernel is not None:  # one that cannot take a cell may still run threads
                self._end_session()
            self.session_lost = False
            self._start_kernel()
        code_fd = os.memfd_create("code")
        os.write(code_fd, code)
        os.lseek(code_fd, 0, os.SEEK_SET)
        head = json.dumps({"id": req.get("id")}).encode()
        socket.send_fds(self.ctl, [head], [in_fd, out_w, err_w, code_fd])
        os.close(code_fd)
        return note

    def _fork_fresh(self, req, in_fd, out_w, err_w):
        """Fork a fresh child for the request; return (control pipe, child pid, note)."""
        ctl_r, ctl_w = os.pipe()
        note = ""
        try:
            child = os.fork()
        except OSError:
            # Between calls only the session kernel is left of the code, and its threads (or
            # zombie children) can fill the pids limit: that is the code's doing, not a
            # failure of the sandbox (which the host would score as infra_error). End the
            # session to make room; still failing after FORK_ROOM_S is the sandbox's.
            if self.kernel is not None:
                self._end_session()
                note = ("[sandbox] the Python session was ended: its threads or processes "
                        "left no room to start this call\n")
            try:
                child = _fork_when_room()
            except OSError:
                os.close(ctl_r)
                os.close(ctl_w)
                raise
        if child == 0:
            _child_run(req, in_fd, out_w, err_w, ctl_w)
        os.close(ctl_w)
        return ctl_r, child, note

    def _settle(self, session, replies, child, msg, killed):
        """Kill what must not outlive the call; return the call's final control message."""
        keep = {os.getpid()} | ({self.kernel} if self.kernel else set())
        if not session and (killed or msg is None):
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
            _, st = os.waitpid(child, 0)  # before any reaping, to keep its exit status
            msg = msg or {"exit_code": _exit_code(st), "memory_error": False}
        if killed or msg is None:
            _kill_strays(keep)  # in a session: the cell's fork dies, the kernel stays
            if session and msg is None:
                msg = _read_msg(replies, time.monotonic() + KILL_WAIT_S)
        if session:
            if msg is None:
                self._drop_kernel()
            elif msg.get("kernel"):
                self.kernel = msg["kernel"]
        else:
            os.close(replies.ctl)
        _kill_strays({os.getpid()} | ({self.kernel} if self.kernel else set()))
        return msg


def _write_file(path, data):
    full = os.path.normpath(os.path.join(WORKDIR, path))
    if not full.startswith(WORKDIR.rstrip("/") + "/"):
        raise ValueError(f"file path {path!r} leaves the work directory")
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as fh:
        fh.write(base64.b64decode(data))


class _Replies:
    """The control channel of one call, read for that call's reply and nothing else.

    Why: in a session the cell's own process holds the kernel socket (it becomes the next
    kernel), so the code can write there too. Only a line that parses as this request's reply,
    naming a kernel of this lineage, counts; bytes glued in front of it are dropped, and the
    buffer is capped, so nothing the code writes can become a failure of the server.
    """

    def __init__(self, ctl, req_id, parents):
        self.ctl, self.req_id, self.parents = ctl, req_id, parents
        self.buf, self.eof = b"", False

    def read(self):
        """Read once; return the reply when it is complete, else None (``eof`` set at EOF)."""
        try:
            if isinstance(self.ctl, socket.socket):
                data = self.ctl.recv(65536)
            else:
                data = os.read(self.ctl, 65536)
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return None
        self.buf = (self.buf + data)[-CTL_CAP:]
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            reply = self._parse(line)
            if reply is not None:
                return reply
        return None

    def _parse(self, line):
        """The reply ``line`` holds, or None; every field the server reads is checked here.

        The line is the code's to write: a JSON array nested 20,000 deep (RecursionError),
        or a kernel pid sent as a string (which the server then failed to kill), escaped as a
        ``server_error``, and the episode became ``infra_error``, dropped from training. So
        nothing that fails here raises, and only fields of the right types count.
        """
        try:
            reply = json.loads(line[line.rfind(b"{"):])
        except Exception:  # ValueError, RecursionError: not a reply
            return None
        if not isinstance(reply, dict) or reply.get("id") != self.req_id:
            return None
        if type(reply.get("exit_code")) is not int:  # not a bool either
            return None
        if type(reply.get("memory_error", False)) is not bool:
            return None
        kernel = reply.get("kernel")
        if kernel is not None and not (
            type(kernel) is int and kernel > 0
            and (kernel in self.parents or _ppid(kernel) in self.parents)
        ):
            return None
        return reply


def _ppid(pid):
    """Parent pid of ``pid`` (None when unknown), from /proc/PID/status."""
    try:
        with open(f"/proc/{int(pid)}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"PPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, TypeError, IndexError):
        pass
    return None


def _read_msg(replies, deadline):
    """The call's reply, or None on EOF or deadline."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([replies.ctl], [], [], remaining)[0]:
            return None
        msg = replies.read()
        if msg is not None or replies.eof:
            return msg


def _pump(out_r, err_r, replies, deadline, limit):
    """Collect output until the call's reply, the deadline, or the output cap."""
    bufs = {out_r: bytearray(), err_r: bytearray()}
    total = 0
    watch = [out_r, err_r, replies.ctl]
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return (bytes(bufs[out_r]), bytes(bufs[err_r]), False), None, "timeout"
        for fd in select.select(watch, [], [], remaining)[0]:
            if fd is replies.ctl:
                msg = replies.read()
                if msg is not None or replies.eof:
                    return (bytes(bufs[out_r]), bytes(bufs[err_r]), False), msg, None
                continue
            data = os.read(fd, 65536)
            if not data:
                watch.remove(fd)
                continue
            take = min(len(data), limit - total)
            bufs[fd] += data[:take]
            total += take
            if take < len(data):
                return (bytes(bufs[out_r]), bytes(bufs[err_r]), True), None, "output_limit"


def _drain(out_r, err_r, outs, limit):
    """Read what is left in the pipes (every writer is dead by now), within the cap."""
    out, err, truncated = bytearray(outs[0]), bytearray(outs[1]), outs[2]
    room = limit - len(out) - len(err)
    deadline = time.monotonic() + KILL_WAIT_S
    for fd, buf in ((out_r, out), (err_r, err)):
        while time.monotonic() < deadline and select.select([fd], [], [], 0.05)[0]:
            data = os.read(fd, 65536)
            if not data:
                break
            take = min(len(data), max(room, 0))
            buf += data[:take]
            room -= take
            truncated = truncated or take < len(data)
        os.close(fd)
    return bytes(out), bytes(err), truncated


def _tar_workdir():
    """The work dir as a base64 tar; what the code made unreadable is left out.

    Why not fail: the code owns the work dir, and a file it chmod'ed to 000 must not make a
    snapshot raise (the caller would take that for a failure of the sandbox).
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _tar_tree(tar, WORKDIR, "")
    return {"data": base64.b64encode(buf.getvalue()).decode()}


def _tar_tree(tar, path, arcname):
    """Add what is under ``path`` to ``tar``, a directory's entry before its contents.

    A loop, not a recursion: the code chooses the depth (a recursion raised at 1,000).
    """
    stack = [(path, arcname)]
    while stack:
        top, top_arc = stack.pop()
        try:
            names = sorted(os.listdir(top))
        except OSError:
            continue
        below = []
        for name in names:
            full, arc = os.path.join(top, name), f"{top_arc}/{name}".lstrip("/")
            try:
                tar.add(full, arcname=arc, recursive=False)  # opens a file before its header
            except OSError:
                continue
            if os.path.isdir(full) and not os.path.islink(full):
                below.append((full, arc))
        stack.extend(reversed(below))


def _untar_workdir(data):
    _kill_strays({os.getpid()})
    for name in os.listdir(WORKDIR):
        path = os.path.join(WORKDIR, name)
        if os.path.isdir(path) and not os.path.islink(path):
            _remove_tree(path)
        else:
            os.unlink(path)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data))) as tar:
        members = [m for m in tar.getmembers() if _safe_member(m)]
        tar.extractall(WORKDIR, members=members)
    return {"ok": True}


def _safe_member(member):
    path = os.path.normpath(member.name)
    return not (path.startswith(("/", "..")) or member.isdev() or
                (member.issym() or member.islnk()) and os.path.isabs(member.linkname))


def _write_reply(reply):
    """One JSON line to the host (our stdout is the exec's stream: no one else writes it)."""
    out = sys.stdout.buffer
    out.write(json.dumps(reply).encode() + b"\n")
    out.flush()


def main():
    _harden_self()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    server = Server()
    _write_reply({"ready": True, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        req = json.loads(line)
        try:
            if req["op"] in ("run", "exec"):
                reply = server.call(req)
            elif req["op"] == "reset":
                left = server.clean()
                server.session_lost = False  # a new lease starts with a new session anyway
                reply = {"ok": not left, "left": left}
            elif req["op"] == "tar":
                reply = _tar_workdir()
            elif req["op"] == "untar":
                server._drop_kernel()
                reply = _untar_workdir(req["data"])
            else:
                reply = {"pong": True}
        except UnicodeEncodeError as exc:  # text of the request (a lone surrogate): the caller's
            reply = {"input_error": f"the request holds text that is not Unicode: {exc}"}
        except Exception as exc:
            reply = {"server_error": f"{type(exc).__name__}: {exc}"}
        reply["id"] = req.get("id")
        _write_reply(reply)


if __name__ == "__main__":
    main()
