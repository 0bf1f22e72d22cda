"""Verification runner: runs inside the sandbox as one process per sample (standard library).

Reads ``{"code", "tests", "mode", "per_test_timeout", "total_timeout"}`` as JSON on stdin and
writes one line ``MARKER + JSON`` with per-test results to its original stdout. Each test runs
in its own process (new session, killed at its deadline), so a test that hangs, crashes or
exits cannot take the others with it. The candidate's output never reaches the runner's
stdout: in ``assert`` and ``pytest`` modes it goes to /dev/null, in ``stdio`` mode to a pipe
that the runner compares with the expected output.

Who decides a verdict (the reward hack this design closes): in ``assert`` and ``pytest``
modes a test's child is a *judge* that never runs the candidate's code. The candidate's code
runs in a *solution* process that serves calls (function name and arguments in, result out)
over a pipe pair, in length-prefixed frames that carry plain data only (`encode`/`decode`;
JSON from the candidate's side). The test runs in the judge with each candidate function
replaced by a `_Remote` proxy, so its pass or fail is the judge's own execution: the
candidate can patch ``json``, ``AssertionError`` or ``sys.settrace`` in its own process only,
holds no fd of the judge's result pipe or of the runner, and a result that is not plain data
(an object whose ``__eq__`` always says True) fails the test. A solution process that dies,
exits or hangs fails (or times out) the call that needed it. The runner and its judges are
non-dumpable, so the candidate (same uid) can neither read their memory or fds through /proc
nor ptrace them, and the judge imports nothing from a directory the candidate could write.

Where the candidate's processes come from (the expected answers stay out of its reach): not
from the runner or a judge, whose memory holds every test of the sample (and so does any fork
of the code server, which received them), but from a *factory*: a fresh interpreter started
with ``posix_spawn`` once per sample, which is only ever given the code and forks a solution
process (or, in ``stdio`` mode, the program's process) on request; see `Factory`. In
``pytest`` mode the test module exists only in the judge's memory (`_link_tests`).

``pytest`` mode runs real pytest in the judge on ``test_solution.py`` in a temp dir, with
``solution`` a module whose attributes are proxies (the solution process starts at the first
call, after collection, and restarts after a call that failed midway). A plugin streams
per-test outcomes to the runner and sets a SIGALRM per-test timeout; a skip, xfail or
deselection the task did not declare counts as a failure. A test module that fails to import
or collects no tests is one failure that says so: a task whose tests are broken must never
pass a sample, nor stop a training run. If pytest is not importable in the image, a minimal
built-in runner calls every top-level ``test_*`` function instead (no fixtures, no
parametrize) and reports ``runner="builtin"``.

The sample's ``total_timeout`` (see `_budget`): no test starts once it has run out, the test
running then is cut at it, and both are ``timeout`` with `TOTAL_RAN_OUT` as their message;
tests that finished keep their verdicts. The report must reach the host before its own
deadline (``total_timeout`` + ``RUNNER_SLACK_S`` in ``_verify.py``), so nothing after the
deadline waits on the candidate: ending its processes takes at most ``FACTORY_WAIT_S``.
"""

# ruff: noqa: E402 (the imports below wait until sys.path is safe)
import os
import sys

ORIGINAL_PATH = list(sys.path)  # what the candidate's code gets, as any program would
FACTORY_NAME = "agentgym_factory"  # __name__ of this module in the factory (see Factory)


def _trusted_imports():
    """Drop sys.path entries the candidate (same uid) could plant a module in.

    Entries inside the interpreter's own installation stay (read-only in the image).
    """
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}

    def trusted(entry):
        real = os.path.realpath(entry) if entry else ""
        if not real or real == os.path.realpath(os.getcwd()):
            return False
        if any(real == root or real.startswith(root + os.sep) for root in roots):
            return True
        return os.path.isdir(real) and not os.access(real, os.W_OK)

    sys.path[:] = [entry for entry in sys.path if trusted(entry)]


# Before any other import. The runner runs in a fork of the code server, whose cwd is the
# work dir and whose sys.path starts with '' (the cwd): a tempfile.py, ast.py or pytest.py
# that the code left there (a tool call earlier in the lease, a restored snapshot) would be
# imported into the runner itself, which writes the report. os and sys are loaded already.
_trusted_imports()

import _signal as signal  # signal.py would bring enum: a third of the factory's start-up
import builtins
import marshal
import select
import struct
import time
import types

if __name__ != FACTORY_NAME:  # the factory and the candidate's processes do without (_dumps)
    import importlib
    import json
    import socket

MARKER = "\x00agentgym-verify\x00"
STATUSES = ("passed", "failed", "timeout", "skipped")
OUTPUT_CAP = 1 << 20
FRAME_CAP = 16 << 20
ALARM_EARLY_S = 0.005  # a per-test SIGALRM this early is still the timer's (clock slack)
TESTS_FD = 100  # lowest fd of the judge's memfd of the pytest module (see _link_tests)
PLAIN = "None, bool, int, float, complex, str, bytes and lists, tuples, sets, dicts of them"
TESTS_FILE = "test_solution.py"  # the pytest module's name in the judge's workspace
NO_TESTS = "pytest collected no tests: name test functions test_* (or classes Test*)"
NO_BUILTIN_TESTS = (
    "the test file has no top-level test_* function (pytest is missing in the image and the "
    "built-in runner takes no classes): name test functions test_*"
)
BROKEN_TESTS = "the test file itself failed to import or collect, before any test ran"
ITERATION_ENDERS = ("StopIteration", "StopAsyncIteration")  # never rebuilt (see _rebuilt)
TOTAL_RAN_OUT = "the sample's total_timeout ({:g}s) ran out before this test finished"
#: Standard-library modules whose import does something (prints, opens a browser, a window).
ACTING_MODULES = frozenset({"this", "antigravity", "idlelib", "turtle", "turtledemo", "tkinter"})
AFTER_TIMEOUT = "not run: {} timed out, and a timeout ends the sample's tests"


def _prctl(option, value):
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        return -1


def _not_dumpable():
    """PR_SET_DUMPABLE 0: the candidate (same uid) cannot read this process.

    Neither ptrace nor its /proc files (mem, fd, environ, maps). Forks keep it; an execve
    resets it.
    """
    _prctl(4, 0)


def _close_fds_except(keep):
    """Close every fd from 3 up except those in ``keep``."""
    low = 3
    for fd in sorted(set(keep)) + [1 << 16]:
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data) :]


# --- plain data: the only values that cross from the candidate's process to the judge -------


class NotPlainData(Exception):
    """A value that cannot cross between the judge and the solution process."""


CONTAINERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def encode(value):
    """A JSON-able form of plain data: scalars as JSON, containers tagged by their type.

    Exact types only: a subclass of int or str could redefine ``__eq__``.
    """
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind in (list, tuple, set, frozenset):
        return {kind.__name__: [encode(item) for item in value]}
    if kind is dict:
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    raise NotPlainData(f"a {kind.__name__}")


def decode(obj):
    """The value `encode` gave ``obj`` for; `NotPlainData` for anything else."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if type(obj) is dict and len(obj) == 1:
        ((tag, body),) = obj.items()
        if tag in CONTAINERS and type(body) is list:
            return CONTAINERS[tag](decode(item) for item in body)
        if (
            tag == "dict"
            and type(body) is list
            and all(type(pair) is list and len(pair) == 2 for pair in body)
        ):
            return {decode(k): decode(v) for k, v in body}
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "complex" and type(body) is list and len(body) == 2:
            if all(type(part) in (int, float) for part in body):
                return complex(*body)
    raise NotPlainData(f"an unknown form {str(obj)[:80]!r}")


def decode_reply(obj, what):
    """`decode`, where anything odd becomes the judge's `CandidateError`."""
    try:
        return decode(obj)
    except (NotPlainData, TypeError, ValueError, RecursionError) as exc:
        raise CandidateError(f"{what} is not plain data ({PLAIN}): {exc}") from None


# --- frames: a 4-byte big-endian length, then that many bytes ------------------------------
#
# The judge's requests are marshal (the candidate's process may trust the judge); what comes
# back from the candidate's side is JSON, which the judge parses and checks.


def _dumps(obj):
    """JSON text of plain data, as ``json.dumps`` writes it, without importing json.

    Why: the candidate's processes come from the factory, which starts once per sample; json
    brings re and enum, half of its start-up. ``_json`` is the C encoder json itself uses.
    """
    try:
        import _json

        encoder = _json.make_encoder(None, _not_json, _json.encode_basestring_ascii, None,
                                     ":", ",", False, False, True)
    except (ImportError, AttributeError, TypeError):  # not CPython
        import json

        return json.dumps(obj)
    return "".join(encoder(obj, 0))


def _not_json(value):
    raise TypeError(f"a {type(value).__name__} is not JSON")


def _json_object(data):
    """A JSON object from the candidate's side; ValueError for anything else."""
    obj = json.loads(data)
    if type(obj) is not dict:
        raise ValueError("a frame that is not a JSON object")
    return obj


def send(fd, data):
    _write_all(fd, struct.pack(">I", len(data)) + data)


def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def recv(fd):
    """One frame's bytes; EOFError at end of stream, ValueError for an oversized frame."""
    (size,) = struct.unpack(">I", _read_exact(fd, 4))
    if size > FRAME_CAP:
        raise ValueError(f"a frame of {size} bytes (the cap is {FRAME_CAP})")
    return _read_exact(fd, size)


# --- the solution process: runs the candidate's code, trusted with nothing -------------------


def _serve(code, module_name, workdir, req_r, resp_w):
    """Run ``code``, send its manifest, then answer calls until the judge closes the pipe."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _close_fds_except({req_r, resp_w})
    if workdir:
        try:
            os.chdir(workdir)
        except OSError:
            pass
    sys.path[:] = ([workdir] if workdir else []) + ORIGINAL_PATH
    module = types.ModuleType(module_name)
    if module_name != "__main__":
        sys.modules[module_name] = module
    try:
        exec(compile(code, "solution.py", "exec"), module.__dict__)
        reply = {"ready": _manifest(module.__dict__)}
    except BaseException as exc:
        reply = {"error": f"{_describe(exc)} in the code, before the test finished"}
    send(resp_w, _dumps(reply).encode())
    if "error" in reply:
        return
    while True:
        try:
            request = marshal.loads(recv(req_r))
        except EOFError:
            return
        send(resp_w, _dumps(_answer(module.__dict__, request)).encode())


def _describe(exc):
    try:
        if isinstance(exc, SystemExit):
            return f"SystemExit({exc.code!r})"
        return f"{type(exc).__name__}: {exc}"[:1000]
    except Exception:
        return type(exc).__name__


def _manifest(namespace):
    """What the code defines: functions (called remotely), plain values (copied), the rest."""
    out = {"functions": [], "classes": [], "values": {}, "modules": {}, "other": []}
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            out["modules"][name] = str(value.__name__)
        elif isinstance(value, type):
            out["classes"].append(name)
        elif callable(value):
            out["functions"].append(name)
        else:
            try:
                out["values"][name] = encode(value)
            except (NotPlainData, RecursionError):
                out["other"].append(name)
    return out


def _answer(namespace, request):
    name = str(request.get("call"))
    func = namespace.get(name)
    if not callable(func) or isinstance(func, type):
        return {"error": f"the code defines no function {name}()"}
    try:
        args, kwargs = decode(request["args"]), decode(request["kwargs"])
        value = func(*args, **kwargs)
    except BaseException as exc:
        text, prefix = _describe(exc), type(exc).__name__ + ": "
        return {"raised": type(exc).__name__, "message": text.removeprefix(prefix)}
    try:
        return {"value": encode(value)}
    except (NotPlainData, RecursionError, ValueError) as exc:
        return {
            "error": f"{name}() returned {exc}, which is not plain data ({PLAIN}); "
            f"only plain data crosses to the test"
        }


# --- the factory: where every process that runs the candidate's code comes from --------------

# This module's own code object, which the factory (a fresh interpreter) runs to get the same
# functions as the runner without the runner's memory.
_MODULE_CODE = sys._getframe().f_code
FACTORY_IGNORES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGALRM,
                   signal.SIGUSR1, signal.SIGUSR2)
FACTORY_WAIT_S = 2.0  # how long the runner waits for the factory to end the candidate's processes
FACTORY_BOOT = f"""\
import marshal, os
blob = b''
while True:
    chunk = os.read(0, 1 << 20)
    if not chunk:
        break
    blob += chunk
module, args = marshal.loads(blob)
del blob, chunk
g = {{'__name__': {FACTORY_NAME!r}, '__builtins__': __builtins__}}
exec(module, g)
g['_factory_main'](*args)
"""


class Factory:
    """The runner's side of its factory process, which forks every candidate process.

    Why a separate, freshly executed interpreter: a fork of the runner (or of the judge) holds
    every test of the sample, and so does every fork of the code server, whose request carried
    them; the candidate could find the expected answers there (``gc.get_objects()``, frames,
    or its own heap). The factory is started with ``posix_spawn``, once per sample, and is
    only ever sent the code, ``sys.path`` and ``sys.argv``; its children (the candidate's
    processes) start from its clean state. Requests and replies are JSON datagrams on a
    SOCK_SEQPACKET socket pair, with the candidate's pipes passed as fds (SCM_RIGHTS). The
    runner and its judges (forks, one at a time) share the socket; replies carry the
    request's id, so one left by a judge killed mid-request is skipped.
    """

    def __init__(self, code):
        self.code = code
        self.pid = None
        self.sock = None
        self.problem = None  # why the factory could not start
        self.count = 0

    def fds(self):
        return () if self.sock is None else (self.sock.fileno(),)

    def ensure(self):
        """Start the factory unless it runs; on failure `problem` says why."""
        if self.sock is not None:
            return
        try:
            self._start()
            self.problem = None
        except OSError as exc:  # no pid left (the code's fork bomb), no memory
            self.problem = f"cannot start a process for the code ({_describe(exc)})"

    def _start(self):
        args = (None, self.code, list(ORIGINAL_PATH), list(sys.argv))
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        blob = os.memfd_create("factory")
        try:
            args = (theirs.fileno(),) + args[1:]
            _write_all(blob, marshal.dumps((_MODULE_CODE, args)))
            os.lseek(blob, 0, os.SEEK_SET)
            theirs.set_inheritable(True)  # fds 0-2 and this socket are all it inherits
            argv = [sys.executable, "-s", "-c", FACTORY_BOOT]
            actions = [(os.POSIX_SPAWN_DUP2, blob, 0),
                       (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                       (os.POSIX_SPAWN_DUP2, 1, 2)]
            self.pid = os.posix_spawn(sys.executable, argv, os.environ, file_actions=actions)
        except BaseException:
            mine.close()
            raise
        finally:
            os.close(blob)
            theirs.close()
        self.sock = mine

    def request(self, msg, fds=(), wait=None):
        """Send one request; its reply, or None if the factory is gone or silent for ``wait`` s."""
        if self.sock is None:
            return None
        self.count += 1
        msg = dict(msg, id=f"{os.getpid()}.{self.count}")
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
        try:
            self.sock.sendmsg([marshal.dumps(msg)], ancillary if fds else [],
                              socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except OSError:
            return None
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
                    return None
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                return None
            if not data:
                return None
            try:
                reply = json.loads(data)
            except (ValueError, RecursionError):
                continue
            if type(reply) is dict and reply.get("id") == msg["id"]:
                return reply

    def spawn(self, role, fds, wait=None, **args):
        """Start a candidate process (`CandidateError` if none starts); return its pid."""
        reply = self.request({"op": "spawn", "role": role, **args}, fds, wait)
        if reply is None:
            raise CandidateError(self.problem or "the process for the code could not be "
                                 "started: its factory is gone or did not answer")
        if type(reply.get("pid")) is not int:
            raise CandidateError(str(reply.get("error"))[:1000])
        return reply["pid"]

    def end(self):
        """Kill every candidate process; a factory that does not answer is stopped.

        A new one starts at the next `ensure`: the candidate (same uid) can stop or kill its
        factory, and that must cost it this test only. Returns False when it did not answer.
        """
        if self.sock is not None and self.request({"op": "end"}, wait=FACTORY_WAIT_S) is None:
            self.stop()
            return False
        return True

    def stop(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            self.pid = None


def _factory_main(ctl_fd, code, original_path, argv):
    """The factory's loop (in a fresh interpreter): fork candidate processes, end them."""
    _not_dumpable()  # an execve made it dumpable again; the candidate must not reach its fds
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _close_fds_except({ctl_fd})
    # The candidate (its child, same uid) can signal it: a SIGALRM or SIGTERM must not end
    # it (and every call of the test in progress with it). Its children reset them.
    for sig in FACTORY_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    # what the candidate saw as a fork of the runner: big ints, the code server's sys.path
    # and sys.argv
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    ORIGINAL_PATH[:] = original_path
    sys.argv[:] = argv
    import _socket  # socket.py would bring enum (see _dumps)

    ctl = _socket.socket(fileno=ctl_fd)
    room = _socket.CMSG_SPACE(4 * struct.calcsize("i"))
    children = []
    while True:
        try:
            msg, ancillary, _, _ = ctl.recvmsg(1 << 16, room)
        except OSError:
            break
        fds = []
        for level, kind, data in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += struct.unpack(f"{len(data) // 4}i", data[: len(data) // 4 * 4])
        if not msg:
            break
        try:
            req = marshal.loads(msg)
            if req["op"] == "spawn":
                reply = _factory_spawn(code, req, fds, children)
            else:
                _end_children(children)
                reply = {}
            reply["id"] = req["id"]
        except (ValueError, KeyError, TypeError, IndexError, EOFError) as exc:
            reply = {"error": f"a bad request ({_describe(exc)})"}
        finally:
            for fd in fds:
                os.close(fd)
        try:
            ctl.send(_dumps(reply).encode())
        except OSError:
            break
    _end_children(children)
    os._exit(0)


def _factory_spawn(code, req, fds, children):
    factory = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        return {"error": f"cannot start a process for the code ({_describe(exc)})"}
    if pid == 0:
        try:
            # its own process group, so that ending it ends the processes it forked too
            os.setsid()
            _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a killed factory takes it along
            if os.getppid() != factory:
                os._exit(0)
            if req["role"] == "program":
                in_fd, out_w, res_w = fds
                _watch_program(code, in_fd, out_w, res_w)
            else:
                _default_signals()
                req_r, resp_w = fds
                _serve(code, str(req["module"]), req.get("workdir"), req_r, resp_w)
        finally:
            os._exit(0)
    children.append(pid)
    return {"pid": pid}


def _default_signals():
    for sig in (*FACTORY_IGNORES, signal.SIGPIPE):  # as in a fork of the runner
        signal.signal(sig, signal.SIG_DFL)


PROGRAM_KILLED_HARNESS = ("the program killed its test harness (the process that watches it, "
                          "or the factory that started it) before its end was known")


def _watch_program(code, in_fd, out_w, res_w):
    """A ``stdio`` case's watcher: fork the program, wait for it, report how it ended.

    Why a watcher, and not a line the program's own process writes when its code returns:
    a correct program that flushed its answer and ended with ``os._exit(0)`` never wrote
    that line and failed as "died"; and one that killed its parent (the factory) raced its
    line against its own death signal, so the same code scored at random. The verdict is
    now the program's exit status, as its parent sees it (0: ran to its end), and the output
    the runner compares; the program holds fds 0-2 only (and a pipe that may carry its
    exception's text, never a verdict). A program that kills its watcher never has a line
    written for it, so it fails, every time. The watcher keeps the factory's ignored signals.
    """
    watcher = os.getpid()
    msg_r, msg_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        result = {"passed": False, "error": f"cannot start a process for the code "
                                            f"({_describe(exc)})"}
        os.write(res_w, (_dumps(result) + "\n").encode())
        os._exit(0)
    if pid == 0:
        try:
            _prctl(1, signal.SIGKILL)  # a killed watcher takes the program along
            if os.getppid() != watcher:
                os._exit(1)
            _default_signals()
            _run_program(code, in_fd, out_w, msg_w)
        finally:
            os._exit(1)
    for fd in (in_fd, out_w, msg_w):  # the program's stdout reaches EOF when the program ends
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    os.set_blocking(msg_r, False)
    try:
        why = os.read(msg_r, 1000).decode("utf-8", "replace")
    except OSError:
        why = ""
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        result = {"passed": True}
    elif os.WIFSIGNALED(status):
        result = {"passed": False, "error": why or f"the program was killed by signal "
                                                   f"{os.WTERMSIG(status)}"}
    else:
        result = {"passed": False, "error": why or f"the program exited with status "
                                                   f"{os.WEXITSTATUS(status)}"}
    os.write(res_w, (_dumps(result) + "\n").encode())
    os._exit(0)


def _run_program(code, in_fd, out_w, msg_w):
    """The program's process: the code as ``__main__`` on fds 0-2; exits with its status.

    It keeps fds 0-2 and ``msg_w``, where the text of how it failed goes (never a verdict).
    """
    why = _run_own_fds(lambda: _program(code)(None), in_fd, out_w, {msg_w}, exit_ok=True)
    if why:
        try:
            os.write(msg_w, why.encode("utf-8", "replace")[:1000])
        except OSError:
            pass
    os._exit(0 if why is None else 1)


def _end_children(children):
    for pid in children:
        _kill_session(pid)
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
    children.clear()


def _kill_session(pid):
    """SIGKILL ``pid``'s process group and ``pid`` itself.

    Why both: the child calls ``setsid`` first thing, and one killed before it did (forked
    just before its deadline) has no group yet; ``killpg`` alone misses it, and the
    ``waitpid`` after it then waits for the whole test to run, past the host's deadline.
    """
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _program(code):
    """The body of a ``stdio`` program's process (see `_run_program`)."""

    def body(_res_w):
        sys.path[:] = ORIGINAL_PATH  # the program may import from its cwd, as before
        sys.stdin = _stdin()
        exec(compile(code, "solution.py", "exec"), {"__name__": "__main__"})

    return body


def _stdin():
    """A fresh ``sys.stdin`` on fd 0, as the code server gives every run."""
    import io

    return io.TextIOWrapper(os.fdopen(0, "rb", closefd=False))


# --- the judge's side: proxies to the solution process ---------------------------------------


class CandidateError(Exception):
    """The candidate's code failed a call in a way no builtin exception describes."""


class Solution:
    """The candidate's code in a process of the factory, reached by calls over a pipe pair.

    A call that fails midway (the process died, a garbled frame, a timeout while waiting)
    kills the process; the next call starts a fresh one.
    """

    def __init__(self, factory, module_name, workdir=None):
        self.factory, self.module_name, self.workdir = factory, module_name, workdir
        self.pid = None
        self.manifest = None

    def start(self):
        _trusted_imports()
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        try:
            pid = self.factory.spawn("serve", [req_r, resp_w], module=self.module_name,
                                     workdir=self.workdir)
        except BaseException:
            os.close(req_w)
            os.close(resp_r)
            raise
        finally:
            os.close(req_r)
            os.close(resp_w)
        self.pid, self.req, self.resp = pid, req_w, resp_r
        reply = self._exchange(None, "while running the code")
        if set(reply) != {"ready"} or type(reply["ready"]) is not dict:
            self.stop()
            raise CandidateError(_error_of(reply, "the solution process"))
        self.manifest = reply["ready"]
        return self.manifest

    def call(self, name, args, kwargs):
        try:
            request = {"call": name, "args": encode(args), "kwargs": encode(kwargs)}
        except (NotPlainData, RecursionError) as exc:
            raise TypeError(
                f"an argument of {name}() is {exc}, which is not plain data "
                f"({PLAIN}); only plain data crosses to the candidate"
            ) from None
        if self.pid is None:
            self.start()
        reply = self._exchange(request, f"during {name}()")
        if set(reply) == {"value"}:
            return decode_reply(reply["value"], f"the value of {name}()")
        if set(reply) == {"raised", "message"}:
            raise _rebuilt(str(reply["raised"]), str(reply["message"])[:1000], name)
        raise CandidateError(_error_of(reply, f"{name}()"))

    def _exchange(self, request, when):
        try:
            if request is not None:
                send(self.req, marshal.dumps(request))
            return _json_object(recv(self.resp))
        except (EOFError, BrokenPipeError):
            self.stop()
            raise CandidateError(f"the solution process exited {when}") from None
        except (ValueError, RecursionError) as exc:
            self.stop()
            raise CandidateError(f"the solution process sent a garbled reply ({exc})") from None
        except BaseException:  # a timeout mid-call: the process is in an unknown state
            self.stop()
            raise

    def stop(self):
        if self.pid is None:
            return
        for fd in (self.req, self.resp):
            os.close(fd)
        _kill_session(self.pid)  # now: a factory the candidate stopped cannot keep it running
        self.pid = None
        self.factory.request({"op": "end"}, wait=FACTORY_WAIT_S)  # this judge's only one


def _error_of(reply, what):
    if set(reply) == {"error"} and type(reply["error"]) is str:
        return reply["error"][:1000]
    return f"{what} sent a reply of an unknown form"


def _rebuilt(name, message, func):
    """The exception the candidate's function raised, as a builtin exception when it is one.

    So a test that expects ``ValueError`` can catch it; anything else (SystemExit, the
    code's own classes) is a `CandidateError` naming it, and so are the exceptions that steer
    the judge's own control flow (`ITERATION_ENDERS`): a ``StopIteration`` raised inside the
    test's ``map()`` or ``filter()`` would end it early, so ``all(map(f, cases))`` passed
    (Python turns one leaving a generator into RuntimeError for the same reason, PEP 479).
    """
    cls = getattr(builtins, name, None) if name.isidentifier() else None
    if isinstance(cls, type) and issubclass(cls, Exception) and name not in ITERATION_ENDERS:
        try:
            return cls(message)
        except Exception:
            pass
    return CandidateError(f"{func}() raised {name}: {message}")


class _Remote:
    """Stands in the test's namespace for a name of the candidate's code.

    A function is called in the solution process; anything else (``why`` says what) fails
    the test when used, since only function calls and plain data cross to the judge.
    """

    def __init__(self, solution, name, why=None):
        self._solution, self._why = solution, why
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        if self._why is not None:
            raise CandidateError(
                f"{self.__name__} is {self._why} in the candidate's code: tests can only call "
                "its functions and read its plain-data values (see docs/sandboxes.md)"
            )
        return self._solution.call(self.__name__, args, kwargs)

    def __getattr__(self, attr):
        raise AttributeError(
            f"{self.__name__}.{attr}: only calls to the candidate's functions cross to the test"
        )

    def __repr__(self):
        return f"<candidate's {self.__name__}>"


def _stdlib_module(name):
    """The judge's own import of a standard-library module the candidate imported.

    Not a private one (``_thread``, ``unittest.__main__``) nor one whose import acts
    (``this``, ``antigravity``): the name is the candidate's word, and importing
    ``unittest.__main__`` ran unittest inside the judge, collecting ``test*.py`` files the
    candidate could have written.
    """
    parts = name.split(".")
    if not all(part.isidentifier() and not part.startswith("_") for part in parts):
        return None
    if parts[0] in ACTING_MODULES:
        return None
    if parts[0] not in getattr(sys, "stdlib_module_names", sys.builtin_module_names):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _names(manifest, key, kind):
    names = manifest.get(key)
    if type(names) is not kind or not all(type(n) is str for n in names):
        raise CandidateError("the solution process sent a manifest of an unknown form")
    return names


def _namespace(solution, manifest):
    """The candidate's names as the test sees them; builtins are never shadowed."""
    ns = {}
    for name, module in _names(manifest, "modules", dict).items():
        ns[name] = _stdlib_module(str(module)) or _Remote(solution, name, "a module")
    for name, value in _names(manifest, "values", dict).items():
        try:
            ns[name] = decode(value)
        except (NotPlainData, TypeError, ValueError, RecursionError):
            ns[name] = _Remote(solution, name, "a value that is not plain data")
    for name in _names(manifest, "functions", list):
        ns[name] = _Remote(solution, name)
    for name in _names(manifest, "classes", list):
        ns[name] = _Remote(solution, name, "a class")
    for name in _names(manifest, "other", list):
        ns[name] = _Remote(solution, name, "an object that is not plain data")
    return {k: v for k, v in ns.items() if k.isidentifier() and not hasattr(builtins, k)}


def _solution_module(solution):
    """A ``solution`` module for the tests: every public attribute is a remote function."""
    module = types.ModuleType("solution")

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Remote(solution, name)

    module.__getattr__ = __getattr__
    return module


# --- one test's process: deadline, new session, fds closed, output capped ---------------------


def _child(body, res_w, keep=()):
    """A test's process: fds 0-2 on /dev/null, ``res_w`` (its result) and ``keep`` open.

    ``keep`` is the factory's socket. Why: a judge holds no fd of the harness (the runner's
    report, its stdin with every test).
    """
    why = _run_own_fds(lambda: body(res_w), None, None, {res_w, *keep}, exit_ok=False)
    result = {"passed": True} if why is None else {"passed": False, "error": why}
    os.write(res_w, (_dumps(result) + "\n").encode())
    os._exit(0)


def _run_own_fds(run, in_fd, out_w, keep, exit_ok):
    """In a fresh child: run ``run()`` on its own fds; return None, or why it failed.

    Fds 0 and 1 are ``in_fd`` and ``out_w`` (/dev/null when None), fd 2 is /dev/null, and of
    the others only ``keep`` stays open. A ``SystemExit`` fails it, unless ``exit_ok`` (a
    ``stdio`` program may end with exit(0)) and its code is 0 or None; a test must run to its
    end. Standard output is flushed before it returns.
    """
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(in_fd if in_fd is not None else null, 0)
    os.dup2(out_w if out_w is not None else null, 1)
    os.dup2(null, 2)
    _close_fds_except(keep)
    why = None
    try:
        run()
    except SystemExit as exc:
        if not exit_ok or exc.code not in (None, 0):
            why = f"{_describe(exc)} before the test finished"
    except BaseException as exc:
        why = _describe(exc)
    try:
        sys.stdout.flush()
    except Exception:
        pass
    return why


def _isolated(body, factory, timeout, stream=False):
    """Run the judge ``body(result_fd)`` in a forked child, then end the candidate's processes.

    Returns (lines of its result pipe, duration, problem): the first line, or every line
    until the child ends with ``stream``; ``problem`` says why it ended early.
    """
    factory.ensure()
    res_r, res_w = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.close(res_r)
        _child(body, res_w, factory.fds())
    os.close(res_w)
    lines, _, problem = _wait(res_r, None, started + timeout, stream)
    _kill_session(pid)
    os.waitpid(pid, 0)
    os.close(res_r)
    factory.end()
    return lines, time.monotonic() - started, problem


def _program_run(factory, data, timeout):
    """Run the ``stdio`` program on ``data`` in a process of the factory.

    Returns (lines of its result pipe, its stdout, duration, problem), as `_isolated`.
    """
    started = time.monotonic()
    in_fd = os.memfd_create("stdin")
    _write_all(in_fd, data)
    os.lseek(in_fd, 0, os.SEEK_SET)
    res_r, res_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        factory.ensure()
        factory.spawn("program", [in_fd, out_w, res_w], wait=timeout)
    except CandidateError as exc:
        factory.end()  # a request it answers late must not leave a program running
        # Output already there: the program ran, and killed its factory before the factory's
        # answer reached us (a race, whose message must not read as a start that failed)
        ran = bool(select.select([res_r, out_r], [], [], 0)[0])
        os.close(res_r)
        os.close(out_r)
        if time.monotonic() >= started + timeout:
            return [], b"", time.monotonic() - started, "timed out"
        error = PROGRAM_KILLED_HARNESS if ran else str(exc)
        return [json.dumps({"passed": False, "error": error}).encode()], b"", 0.0, None
    finally:
        for fd in (in_fd, out_w, res_w):
            os.close(fd)
    lines, out, problem = _wait(res_r, out_r, started + timeout, False)
    answered = factory.end()
    if problem is None and (not answered or not lines):
        # The factory gone (it must answer, the program's end notwithstanding), or the
        # watcher dead with no line: the program killed them. Whether its watcher still
        # wrote a line first was a race; the verdict must not be.
        lines = [json.dumps({"passed": False, "error": PROGRAM_KILLED_HARNESS}).encode()]
    os.close(res_r)
    os.close(out_r)
    return lines, out, time.monotonic() - started, problem


def _wait(res_r, out_r, deadline, stream):
    buf, out = bytearray(), bytearray()
    watch = [res_r] + ([out_r] if out_r is not None else [])

    def done(problem=None):
        return bytes(buf).splitlines(), bytes(out), problem

    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return done("timed out")
        for fd in select.select(watch, [], [], remaining)[0]:
            data = os.read(fd, 65536)
            if fd == out_r:
                if not data:
                    watch.remove(fd)
                out += data
                if len(out) > OUTPUT_CAP:
                    return done("output limit exceeded")
                continue
            if not data:
                return done()
            buf += data
            if len(buf) > OUTPUT_CAP:
                return done("the test process wrote too much")
            if not stream and b"\n" in buf:
                _drain(out_r, out, watch, deadline)
                return done()


def _verdict(lines, problem):
    """The test process's verdict: its last line, unless it ended early."""
    if problem is not None:
        return {"passed": False, "timeout": problem == "timed out", "error": problem}
    if not lines:
        return {"passed": False, "error": "the test process died"}
    try:
        result = json.loads(lines[-1])
    except (ValueError, RecursionError):
        result = None
    if not isinstance(result, dict) or not isinstance(result.get("passed"), bool):
        return {"passed": False, "error": "the test process wrote a garbled result"}
    return result


def _drain(out_r, out, watch, deadline):
    """Read what the program left in its stdout pipe, for 0.2 s of quiet at most.

    Bounded by the test's deadline and the cap: a process the program forked can hold the
    pipe and write to it forever after the program itself reported.
    """
    while out_r in watch and len(out) <= OUTPUT_CAP:
        wait = max(0.0, min(0.2, deadline - time.monotonic()))  # 0: only what is there now
        if not select.select([out_r], [], [], wait)[0]:
            return
        data = os.read(out_r, 65536)
        if not data:
            return
        out += data[:OUTPUT_CAP]


def _normalise(text):
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _record(name, result, duration):
    timeout = result.get("timeout")
    status = "passed" if result.get("passed") else "timeout" if timeout else "failed"
    return _outcome(name, status, result.get("error", ""), duration)


def _outcome(name, status, message, duration):
    return {
        "name": name,
        "passed": status == "passed",
        "status": status,
        "message": message,
        "duration": duration,
    }


def _budget(req, total_deadline):
    """(seconds a test may run, whether the sample's total deadline is what bounds it)."""
    left = max(0.0, total_deadline - time.monotonic())
    return min(req["per_test_timeout"], left), left < req["per_test_timeout"]


def _out_of_time(total_deadline):
    """Whether the sample's total deadline has passed: no test may start any more."""
    return time.monotonic() >= total_deadline


def _total_ran_out(req):
    return TOTAL_RAN_OUT.format(req["total_timeout"])


def _not_started(name, req):
    """A test the total deadline left no time for: a timeout, as the candidate spent it."""
    return _outcome(name, "timeout", _total_ran_out(req), 0.0)


def _cut_short(result, cut, req):
    """The verdict of a test whose time ran out, blaming total_timeout when that cut it."""
    if cut and result.get("timeout"):
        return dict(result, error=_total_ran_out(req))
    return result


def _judged(body, factory, req, total_deadline):
    """(verdict, duration) of one judge process."""
    timeout, cut = _budget(req, total_deadline)
    lines, dur, problem = _isolated(body, factory, timeout)
    return _cut_short(_verdict(lines, problem), cut, req), dur


# --- the modes --------------------------------------------------------------------------------


def _each_test(req, total_deadline, prefix, judge):
    """The verdicts of ``judge(i, test) -> (result, duration)`` on each test, in order.

    A test that times out ends the sample: the later ones are timeouts, not run. Why: code
    that hangs on every input made a sample of N tests last N x ``per_test_timeout`` (300 s
    at 30 cases of 10 s), long enough for a trainer's episode deadline to drop it as late,
    so a policy escaped its zero by running out the clock.
    """
    out, timed_out = [], None
    for i, test in enumerate(req["tests"]):
        name = f"{prefix}_{i}"
        if _out_of_time(total_deadline):
            out.append(_not_started(name, req))
        elif timed_out is not None:
            out.append(_outcome(name, "timeout", AFTER_TIMEOUT.format(timed_out), 0.0))
        else:
            out.append(_record(name, *judge(i, test)))
            if out[-1]["status"] == "timeout":
                timed_out = name
    return out


def run_assert(req, factory, total_deadline):
    def judge(i, test):
        def body(_res_w):
            solution = Solution(factory, "__main__")
            g = {"__name__": "__main__", **_namespace(solution, solution.start())}
            exec(compile(test, f"test_{i}", "exec"), g)

        return _judged(body, factory, req, total_deadline)

    return _each_test(req, total_deadline, "test", judge)


def run_stdio(req, factory, total_deadline):
    """The program runs in a process of the factory; the runner compares what it printed."""

    def judge(_i, case):
        timeout, cut = _budget(req, total_deadline)
        lines, got, dur, problem = _program_run(factory, case["input"].encode(), timeout)
        result = _cut_short(_verdict(lines, problem), cut, req)
        if result.get("passed"):
            got_text = got.decode("utf-8", "replace")
            if _normalise(got_text) != _normalise(case["output"]):
                result = {"passed": False, "error": f"wrong output: {got_text[:200]!r}"}
        return result, dur

    return _each_test(req, total_deadline, "case", judge)


def _workspace():
    """The pytest workspace: ``pytest.ini`` only; the judge links ``test_solution.py`` in."""
    import tempfile

    d = tempfile.mkdtemp(prefix="agentgym-verify-")
    with open(os.path.join(d, "pytest.ini"), "w") as fh:  # see _pytest_args
        fh.write("[pytest]\n")
    return d


def _link_tests(d, source):
    """Make ``d/test_solution.py`` a link to a memfd that only this judge can open.

    Why: a file on disk is readable by the candidate (same uid). ``/proc/self/fd/N`` resolves
    in the process that opens it: here to the memfd, in the candidate's process to its own
    fd N (none, or a pipe of its own); ``/proc/<judge>/fd`` is closed to it (not dumpable).
    """
    import fcntl

    fd = os.memfd_create("test_solution.py")
    _write_all(fd, source.encode())
    try:
        # a number the candidate's process does not hold (its pipes are low ones): opening
        # one of its own pipes through the link would only block its call
        fd = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, TESTS_FD)
    except OSError:  # an fd limit below TESTS_FD
        pass
    os.symlink(f"/proc/self/fd/{fd}", os.path.join(d, "test_solution.py"))


def _pytest_args(d):
    """The arguments of pytest.main: the workspace is its whole world.

    Why: without them pytest looks for a config file (pytest.ini, setup.py ...) and for
    conftest.py files in every parent of the workspace, /tmp included, where the code may
    have left one (earlier in the lease): a conftest.py is imported into the judge and could
    make every test pass. ``--noconftest`` as well: a task's tests are one module, so no
    conftest.py is ever the task's, not even one in the workspace itself.
    """
    return [os.path.join(d, "test_solution.py"), "-q", "-p", "no:cacheprovider", "--noconftest",
            "-c", os.path.join(d, "pytest.ini"), "--rootdir", d, "--confcutdir", d]


def _test_module(req):
    return req["tests"] if isinstance(req["tests"], str) else "\n".join(req["tests"])


def run_pytest(req, factory, total_deadline):
    import shutil

    d = _workspace()
    try:
        try:
            import pytest  # noqa: F401
        except ImportError:
            return run_builtin_pytest(req, factory, d, total_deadline), "builtin"
        return _run_real_pytest(req, factory, d, total_deadline), "pytest"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _run_real_pytest(req, factory, d, total_deadline):
    def body(res_w):
        os.chdir(d)
        sys.dont_write_bytecode = True  # a .pyc of the tests in d would be a readable copy
        _link_tests(d, _test_module(req))
        import pytest

        sys.modules["solution"] = _solution_module(Solution(factory, "solution", d))
        _trusted_imports()
        rc = pytest.main(_pytest_args(d), plugins=[_outcomes_plugin(req, res_w)])
        if int(rc) not in (0, 1, 5):
            raise RuntimeError(f"pytest exit code {int(rc)}")

    if _out_of_time(total_deadline):
        return [_not_started("pytest", req)]
    timeout = max(0.0, total_deadline - time.monotonic())
    lines, dur, problem = _isolated(body, factory, timeout, stream=True)
    result = _cut_short(_verdict(lines, problem), True, req)  # its only deadline is the total
    outcomes = _read_outcomes(lines, result)
    if outcomes:
        return outcomes
    if result.get("passed"):  # pytest ran to its end (exit code 5) and reported nothing
        return [_outcome(TESTS_FILE, "failed", NO_TESTS, dur)]
    return [_record("pytest", result, dur)]


def _outcomes_plugin(req, res_w):
    """A pytest plugin that reports each collected test, then each test's outcome (JSON lines).

    A skip or xfail that no ``skip``/``skipif``/``xfail`` marker of the task declares is a
    failure: otherwise code could skip what it cannot solve and leave it out of the score.
    A module that fails or skips at collection is one failure. Tests collected but never
    reported (deselected, or the session stopped) fail when the runner reads the lines.
    """
    import pytest

    def write(obj):
        os.write(res_w, (json.dumps(obj) + "\n").encode())

    class Outcomes:
        def __init__(self):
            self.running = {}
            self.timed_out = set()  # node ids whose per-test timer fired

        def pytest_itemcollected(self, item):
            write({"collected": _test_name(item.nodeid)})

        def pytest_collectreport(self, report):
            if report.failed or report.skipped:
                name = "collecting " + (report.nodeid or "the tests")
                why = f"{BROKEN_TESTS}: {_first_error(report)}" if report.failed else _why(report)
                # pytest's CollectReport has no duration (7.2 in the image, 9.x too)
                write(_outcome(name, "failed", why, getattr(report, "duration", 0.0) or 0.0))

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item):
            deadline = time.monotonic() + req["per_test_timeout"] - ALARM_EARLY_S

            def on_alarm(*_):
                # The candidate's process (same uid) can send this judge a SIGALRM: raised
                # early, the TimeoutError would pass `pytest.raises(Exception)` for a function
                # that never raised. Only the timer's alarm, at the deadline, counts.
                if time.monotonic() >= deadline:
                    self.timed_out.add(item.nodeid)  # not the message: the code can raise it
                    raise TimeoutError("test exceeded {:g}s".format(req["per_test_timeout"]))

            old = signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, req["per_test_timeout"])
            try:
                yield
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            report = (yield).get_result()
            state = self.running.setdefault(
                item.nodeid, _outcome(_test_name(item.nodeid), "passed", "", 0.0)
            )
            state["duration"] += report.duration or 0.0
            if state["status"] == "passed" and not report.passed:  # the first problem decides
                state.update(_phase_outcome(item, report, item.nodeid in self.timed_out))
            if report.when == "teardown":
                write(self.running.pop(item.nodeid))

    return Outcomes()


def _phase_outcome(item, report, timed_out):
    """Status and message of a phase that did not pass (``timed_out``: its timer fired)."""
    why = _why(report)
    if report.failed:
        return {"status": "timeout" if timed_out else "failed", "passed": False, "message": why}
    declared = any(True for name in ("skip", "skipif", "xfail") for _ in item.iter_markers(name))
    if declared:
        return {"status": "skipped", "passed": False, "message": why}
    how = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    message = (
        f"{how} at run time ({why}); only a skip/skipif/xfail marker of the task leaves a "
        "test out of the score"
    )
    return {"status": "failed", "passed": False, "message": message}


def _why(report):
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail)[:1000]
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return str(longrepr[2])[:1000]
    crash = getattr(longrepr, "reprcrash", None)
    return (crash.message if crash is not None else report.longreprtext)[:1000]


def _first_error(report):
    """The first line of a collection error's report that names the exception, and where.

    Why: the report is a traceback through pytest's own import machinery; what the task's
    author needs is the ``E   SyntaxError: ...`` line (and where), not the frames above it.
    """
    import re

    errors = [line[1:].strip() for line in report.longreprtext.splitlines()
              if line.startswith("E ")]
    named = [line for line in errors if re.match(r"[A-Za-z_][\w.]*(:|$)", line)]
    if not named:
        return _why(report)
    where = [m.group(1) for line in errors if (m := re.match(r'File ".*", line (\d+)', line))]
    return (named[0] + (f" (line {where[0]})" if where else ""))[:1000]


def _test_name(nodeid):
    return nodeid.split("::", 1)[-1]


def _read_outcomes(lines, result):
    """Per-test records from the plugin's lines, in collection order; unreported ones failed."""
    collected, reported = [], {}
    for line in lines:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and isinstance(obj.get("collected"), str):
            if obj["collected"] not in collected:
                collected.append(obj["collected"])
        elif isinstance(obj, dict) and obj.get("status") in STATUSES:
            reported.setdefault(str(obj.get("name")), obj)
    status = "timeout" if result.get("timeout") else "failed"
    why = result.get("error") or "deselected, or never ran"
    out = [reported.pop(name, None) or _outcome(name, status, why, 0.0) for name in collected]
    out += list(reported.values())
    return [
        _outcome(
            str(r["name"]),
            r["status"],
            str(r.get("message", ""))[:1000],
            float(r.get("duration") or 0.0),
        )
        for r in out
    ]


def run_builtin_pytest(req, factory, d, total_deadline):
    import ast

    try:
        tree = ast.parse(_test_module(req), TESTS_FILE)
    except (SyntaxError, ValueError) as exc:  # the task's file: a failure, not a dead runner
        return [_outcome("collecting " + TESTS_FILE, "failed",
                         f"{BROKEN_TESTS}: {_describe(exc)}", 0.0)]
    names = [
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")
    ]
    if not names:
        return [_outcome(TESTS_FILE, "failed", NO_BUILTIN_TESTS, 0.0)]
    out = []
    for name in names:
        if _out_of_time(total_deadline):
            out.append(_not_started(name, req))
            continue

        def body(_res_w, name=name):
            os.chdir(d)
            sys.modules["solution"] = _solution_module(Solution(factory, "solution", d))
            _trusted_imports()
            g = {"__name__": "test_solution"}
            exec(compile(_test_module(req), "test_solution.py", "exec"), g)
            g[name]()

        result, dur = _judged(body, factory, req, total_deadline)
        out.append(_record(name, result, dur))
    return out


def main():
    _not_dumpable()
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # no KeyboardInterrupt a test could swallow
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # big ints cross as JSON numbers
    req = json.loads(sys.stdin.read())
    report = os.dup(1)  # the one trusted report goes here; every test child closes it
    total_deadline = time.monotonic() + req["total_timeout"]
    runner = req["mode"]
    factory = Factory(req["code"])
    try:
        if runner == "assert":
            tests = run_assert(req, factory, total_deadline)
        elif runner == "stdio":
            tests = run_stdio(req, factory, total_deadline)
        else:
            tests, runner = run_pytest(req, factory, total_deadline)
    finally:
        factory.stop()
    os.write(report, (MARKER + json.dumps({"tests": tests, "runner": runner}) + "\n").encode())


if __name__ == "__main__":
    main()
