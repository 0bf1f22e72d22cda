"""Tools: plain Python functions the model may call, with an OpenAI JSON schema.

The schema comes from the signature's type hints and the docstring (Google, NumPy or reST
style), so a tool is written once. Parameters the *environment* supplies (a sandbox handle,
the task, the episode state) are injected by name and never appear in the schema: the model
cannot see or forge them.

Pydantic writes each parameter's schema, so a tool may take what real APIs take: pydantic
models, dataclasses and TypedDicts (nested, in lists), dates, enums, unions and Literals.
A call is checked in two steps. First against the schema the model was shown (the contract:
a fast check for the usual simple schemas, else jsonschema, which also checks tools built
from a raw schema: MCP, OpenAPI). Then pydantic turns the JSON values into the declared
types and checks what a schema cannot say (a date's format, a model's own validators);
parameters whose JSON value already is the declared type (``str``, ``list[int]`` ...) skip it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import logging
import numbers
import os
import queue
import re
import reprlib
import threading
import time
import types
import typing
from collections import deque
from collections.abc import (
    Callable,
    Collection,
    Coroutine,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

import docstring_parser
import jsonschema
import pydantic
import pydantic_core

from ._errors import ConfigError, InfraError, ToolArgumentsError, ToolError, ToolTimeoutError
from ._fast_schema import compile_fast_check

#: Parameter names the environment fills in; a tool that declares one gets it injected.
INJECTABLE = frozenset({"task", "state", "sandbox", "messages", "env"})

#: Seconds a cancelled async tool may go on waiting (its cleanup) before it is closed.
CANCEL_GRACE_SECONDS = 1.0
#: An async tool step that holds the event loop this long is called blocking (asyncio's debug
#: mode calls a callback slow from 0.1 s: every other episode waits that long).
BLOCKING_STEP_SECONDS = 0.1

log = logging.getLogger(__name__)

#: Hints whose schema-valid JSON values already are what the function asks for.
_AS_DECODED: tuple[Any, ...] = (str, int, float, bool, type(None), Any, dict, list)
#: Generic origins that take a decoded JSON array or object as it is.
_AS_DECODED_ORIGINS: frozenset[Any] = frozenset(
    {list, dict, Sequence, Iterable, Collection, Mapping, Union, types.UnionType}
)
_REF = "#/$defs/"
#: Schema keywords whose values are data, not schemas: tidying leaves them alone.
_DATA = frozenset({"default", "enum", "const", "examples"})
#: Schema keywords whose values map names to schemas.
_NAMED = frozenset({"properties", "patternProperties", "$defs", "dependentSchemas"})


def type_to_schema(annotation: Any) -> dict[str, Any]:
    """JSON schema for a Python type hint; raises `ConfigError` for types JSON cannot carry.

    Pydantic writes it (models, dataclasses, TypedDicts, dates, enums, unions ...), tidied
    for a model to read: `$defs` inlined except where a type refers to itself, no titles.
    """
    properties, defs, _ = _parameter_schemas(repr(annotation), {"value": annotation})
    return {**properties["value"], **({"$defs": defs} if defs else {})}


def _parameter_schemas(
    owner: str, hints: Mapping[str, Any]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, pydantic.TypeAdapter[Any]]]:
    """Each parameter's tidy schema, the `$defs` they still share, and pydantic's adapters."""
    adapters = {}
    for name, hint in hints.items():
        try:
            adapters[name] = pydantic.TypeAdapter(hint)
        except pydantic.PydanticSchemaGenerationError as exc:
            raise _unsupported(f"{owner}: parameter {name!r} has type {hint!r}", "") from exc
        except pydantic.PydanticUserError as exc:
            raise _unsupported(f"{owner}: parameter {name!r}", str(exc)) from exc
    try:
        by_key, top = pydantic.TypeAdapter.json_schemas(
            [(name, "validation", adapter) for name, adapter in adapters.items()]
        )
    except pydantic.PydanticUserError as exc:
        raise _unsupported(f"{owner}: a parameter", str(exc)) from exc
    defs, keep = top.get("$defs", {}), set[str]()
    properties = {name: _tidy(by_key[name, "validation"], defs, keep) for name in hints}
    kept: dict[str, Any] = {}
    while keep - kept.keys():  # recursive types keep their definition (and what it refers to)
        name = min(keep - kept.keys())
        kept[name] = _tidy(defs[name], defs, keep, (name,))
    return properties, kept, adapters


def _unsupported(what: str, reason: str) -> ConfigError:
    reason = f" ({reason.splitlines()[0]})" if reason else ""
    return ConfigError(
        f"{what}, which cannot be described to a model as a JSON schema{reason}; use JSON "
        "types (str, int, float, bool, list[...], dict[str, ...]), Literal, Enum, "
        "date/datetime, or pydantic models, dataclasses and TypedDicts of them"
    )


def _tidy(node: Any, defs: Mapping[str, Any], keep: set[str], seen: tuple[str, ...] = ()) -> Any:
    """``node`` with `$ref`s inlined (``keep`` gets those that recur) and titles dropped."""
    if isinstance(node, list):
        return [_tidy(n, defs, keep, seen) for n in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_REF):
        name = ref.removeprefix(_REF)
        if name not in seen:
            merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            return _tidy(merged, defs, keep, (*seen, name))
        keep.add(name)
    tidy: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DATA:
            tidy[key] = value
        elif key in _NAMED and isinstance(value, dict):
            tidy[key] = {n: _tidy(v, defs, keep, seen) for n, v in value.items()}
        elif key != "title":
            tidy[key] = _tidy(value, defs, keep, seen)
    return tidy


def _arrives_as_is(annotation: Any) -> bool:
    """Whether every schema-valid JSON value already is what ``annotation`` asks for.

    Such parameters skip pydantic on each call. Anything else (Annotated validators, enums,
    dates, models, tuples ...) is converted, and checked, by pydantic.
    """
    if any(annotation is t for t in _AS_DECODED):
        return True
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return all(type(a) in (str, int, bool, type(None)) for a in args)
    return origin in _AS_DECODED_ORIGINS and all(map(_arrives_as_is, args))


@dataclass
class Tool:
    """A callable the model may invoke, with its OpenAI function schema.

    Build one with the `tool` decorator, or directly from a raw JSON schema. Calling
    `Tool.acall` validates the model's arguments against `parameters`, converts those named
    in `converters` (``tool`` puts pydantic's validators there), adds the injected ones, and
    runs the function under `timeout`:
    async functions on the event loop, sync ones in a worker thread so that a slow tool never
    blocks other episodes (a sync function cannot be killed on timeout; the episode moves on
    and the thread finishes in the background, so put code that must die in a sandbox).
    """

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]
    injected: frozenset[str] = frozenset()
    timeout: float | None = 30.0
    is_async: bool = False
    converters: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    _validator: Any = field(default=None, repr=False, compare=False)
    _surely_valid: Callable[[Any], bool] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_timeout(self.timeout, f"tool {self.name!r}: timeout")
        try:
            text = json.dumps(self.parameters, sort_keys=True)
        except (TypeError, ValueError):  # not JSON (a default of another type): check it as is
            self._validator, self._surely_valid = _checked_schema_of(self.parameters)
        else:
            self._validator, self._surely_valid = _checked_schema(text)

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def validate(self, arguments: Any) -> None:
        """Raise `ToolArgumentsError` naming every schema violation in ``arguments``."""
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(
                f"arguments for {self.name!r} must be a JSON object, got {type(arguments).__name__}"
            )
        broken = _not_unicode(arguments)
        if broken is not None:
            raise ToolArgumentsError(
                f"invalid arguments for {self.name!r}: {broken} holds a lone surrogate (an "
                "escape such as \\ud800 that is not a character); send text only"
            )
        if self._surely_valid is not None and self._surely_valid(arguments):
            return
        problems = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if problems:
            details = "; ".join(
                f"{'/'.join(map(str, p.path)) or 'arguments'}: {p.message}" for p in problems
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name!r}: {details}")

    async def acall(
        self,
        arguments: dict[str, Any],
        context: Mapping[str, Any] | None = None,
        *,
        threads: ToolThreads | None = None,
    ) -> Any:
        """Validate, inject and run; raise a `ToolError` subclass on any failure.

        ``threads`` caps how many sync calls run at once (an env passes its own); None gives
        this call a thread of its own. Cancelling the caller cancels the call: an async tool
        sees `asyncio.CancelledError` and has finished when this returns (closed if it was
        still running `CANCEL_GRACE_SECONDS` later); a sync tool's thread is abandoned (see
        `tool`).
        """
        self.validate(arguments)
        kwargs = self._convert(arguments) if self.converters else dict(arguments)
        for name in self.injected:
            kwargs[name] = (context or {}).get(name)
        try:
            if self.is_async:
                return await self._run_coroutine(kwargs)
            threads = threads or ToolThreads(1)
            await threads.acquire()  # waiting for a slot is not timed
            try:
                return await self._run_in_thread(kwargs)
            finally:
                threads.release()
        except (ToolError, InfraError):
            raise
        except Exception as exc:
            raise ToolError(f"{self.name!r} raised {type(exc).__name__}: {exc}") from exc

    def _convert(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Schema-valid JSON arguments as the Python values the hints ask for.

        A conversion that fails (a date the schema's ``format`` did not check, a model's
        own validator, a custom converter) is the model's mistake to read about, so it
        becomes `ToolArgumentsError` naming the argument, never a crash.
        """
        kwargs = dict(arguments)
        for name, value in arguments.items():
            if name in self.converters and value is not None:
                try:
                    kwargs[name] = self.converters[name](value)
                except pydantic.ValidationError as exc:
                    problems = "; ".join(_describe(name, e) for e in exc.errors())
                    raise ToolArgumentsError(
                        f"invalid arguments for {self.name!r}: {problems}"
                    ) from exc
                except Exception as exc:
                    raise ToolArgumentsError(
                        f"invalid arguments for {self.name!r}: {type(exc).__name__}: {exc}"
                    ) from exc
        return kwargs

    async def _run_coroutine(self, kwargs: dict[str, Any]) -> Any:
        """Run an async tool in the caller's task, under `timeout` counted from the call.

        The tool runs in a context of its own, as a task of its own would, but without one:
        most tool calls finish without ever waiting, and those pay neither a task nor a timer
        (each costs more than the rest of an env step). Only a call that suspends is timed by
        a timer of `_Resume`, with the deadline the call had from its start. When the timeout
        fires or the caller is cancelled, the tool sees `asyncio.CancelledError` where it
        waits, and its cleanup has run when this returns, unless it takes longer than
        `CANCEL_GRACE_SECONDS`: then the tool is closed where it waits (`_Resume`), so a tool
        that ignores cancellation cannot hang its episode. A call that ends past its timeout
        without the timer cutting it (it blocked the event loop, so the timer could not run)
        is timed out all the same: the timeout is the tool's contract. A `TimeoutError` the
        tool raises itself stays the tool's error, not a timeout.
        """
        # The process's clock, not the loop's: a loop may read its clock once per iteration
        # (uvloop does), which would hide exactly the time a blocking tool holds the loop.
        clock = time.monotonic
        start = clock()
        context = contextvars.copy_context()
        coro = self.fn(**kwargs)
        try:
            signal = context.run(coro.send, None)
        except StopIteration as finished:  # the usual call: its one extra cost is a clock read
            if self.timeout is not None and clock() - start > self.timeout:
                raise self._timed_out(clock() - start) from None  # it blocked the loop
            return finished.value
        resume = _Resume(coro, signal, context, self.name, clock() - start)
        if self.timeout is None:
            return await resume
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.timeout - resume.longest, resume.time_out)
        try:
            result = await resume
        except asyncio.CancelledError:
            if resume.withdraw_timeout():
                raise self._timed_out(resume.longest, cut=True) from None
            raise
        finally:
            timer.cancel()
        if clock() - start > self.timeout:  # it blocked the loop past its deadline: the timer
            raise self._timed_out(resume.longest)  # never got to run
        return result

    def _timed_out(self, blocked: float, cut: bool = False) -> ToolTimeoutError:
        """The call's timeout error; ``blocked``: the longest the tool held the event loop.

        A tool that blocks the loop (``time.sleep`` in an ``async def``) cannot be cancelled
        while it does, and holds up every other episode: the model's message and one warning
        per tool say so, with the fix, since the timeout alone would not tell why. ``cut``:
        the timer cut the call, so a block under half the timeout is not named (it did not
        make the call late; a slow service did).
        """
        message = f"{self.name!r} timed out after {self.timeout:g} s"
        least = max(BLOCKING_STEP_SECONDS, (self.timeout or 0.0) / 2 if cut else 0.0)
        if blocked < least:
            return ToolTimeoutError(message)
        warn_once(
            "blocked", self.name,
            "async tool %r blocked the event loop for %.1f s in one go (timeout %g s): every "
            "episode waited, and its timeout could not interrupt it; make it a plain `def` "
            "(it then runs on a thread) or await instead of blocking",
            self.name, blocked, self.timeout,
        )  # fmt: skip
        return ToolTimeoutError(
            f"{message}: it blocked the event loop for {blocked:.1f} s; an async tool must "
            "await instead of blocking, or be a plain `def` (which runs on a thread)"
        )

    async def _run_in_thread(self, kwargs: dict[str, Any]) -> Any:
        """Run a sync tool on a worker thread and wait up to `timeout` for its result.

        The call's future is this call's own, so the timer settles it with a marker instead
        of cancelling anything: a cancellation that reaches here is always the caller's.
        Whenever this stops waiting the future is done, and the thread's late result is
        dropped (`_settle`).
        """
        running = _start_thread(self.fn, kwargs)
        timer = None
        if self.timeout is not None:
            timer = running.get_loop().call_later(self.timeout, _expire, running)
        try:
            result = await running
        finally:
            if timer is not None:
                timer.cancel()
        if result is _TIMED_OUT:
            raise self._timed_out(0.0)  # a thread never blocks the loop
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (no validation), as a plain function."""
        return self.fn(*args, **kwargs)


def check_timeout(timeout: Any, what: str) -> None:
    """Refuse a timeout that is not a positive number of seconds.

    Zero or less would time out every call before it runs, so every episode would see only
    timeout messages; None is the way to say "no limit".
    """
    is_seconds = isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
    if timeout is not None and not (is_seconds and timeout > 0):
        raise ConfigError(
            f"{what} must be a number of seconds > 0, or None for no limit; got {timeout!r}"
        )


@functools.lru_cache(maxsize=1024)
def _checked_schema(text: str) -> tuple[Any, Callable[[Any], bool] | None]:
    """`_checked_schema_of` the schema whose canonical JSON is ``text``, once per schema.

    Envs build their tools again for every instance, and checking a schema against the
    metaschema costs about 1 ms (ToolAPI-v0's 12 OpenAPI tools: 10 ms per env).
    """
    return _checked_schema_of(json.loads(text))


def _checked_schema_of(schema: dict[str, Any]) -> tuple[Any, Callable[[Any], bool] | None]:
    """A validator and a fast check for ``schema``; raises ``SchemaError`` when it is not one."""
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema), compile_fast_check(schema)


def _not_unicode(value: Any) -> str | None:
    r"""Where in ``value`` (parsed JSON) a string holds a lone surrogate; None if nowhere.

    Why: JSON may spell one (``"\ud800"``), and a tool that sends its arguments on (to a
    sandbox, an MCP server, a web API) fails to encode it as UTF-8 there, which looks like the
    service failing (`InfraError`: the episode dropped, not scored). A model could pick how its
    outcome counts; here it is the model's mistake, before any tool runs. Every call of every
    tool pays for this check, so a path (``arguments/a/1``) is built only once one is found.
    """
    found = _surrogate_at(value)
    return None if found is None else "arguments" + found


def _surrogate_at(value: Any) -> str | None:
    """The path below ``value`` to a string holding a lone surrogate ("" for ``value``)."""
    if isinstance(value, str):
        return None if _is_text(value) else ""
    items: Any = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ()
    )  # fmt: skip
    for key, item in items:
        if not _is_text(key):
            return " (a name)"
        if isinstance(item, (str, dict, list)) and not (isinstance(item, str) and item.isascii()):
            found = _surrogate_at(item)
            if found is not None:
                return f"/{key}{found}"
    return None


def _is_text(value: Any) -> bool:
    """Whether ``value`` is not a str holding a lone surrogate (ASCII, the usual case, is)."""
    if not isinstance(value, str) or value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _describe(argument: str, error: Any) -> str:
    """One pydantic error as ``path/to/field: message (got value)``."""
    path = "/".join(map(str, (argument, *error["loc"])))
    got = error.get("input")
    shown = f" (got {got!r})" if isinstance(got, (str, int, float)) and len(repr(got)) < 80 else ""
    return f"{path}: {error['msg']}{shown}"


class _Resume:
    """Awaiting this runs the rest of ``coro``, which has already run up to yielding ``signal``.

    Each step of ``coro`` runs in ``context``. What the awaiting task sends or throws (a
    result, `asyncio.CancelledError`) goes on to ``coro``, as ``await coro`` would have done,
    and ``longest`` keeps the longest step (how long the tool held the event loop in one go;
    ``first``: its first step's).

    A cancellation of the call (its timeout, or the caller's) holds whatever the tool does
    with it. A tool that returns or raises while one is pending raises it. One that goes on
    waiting (its cleanup awaits, or it swallows cancellations) gets `CANCEL_GRACE_SECONDS`;
    then it is closed where it waits (``coro.close()``: its ``finally`` blocks run) and the
    call ends, so it cannot hang its episode. Cancellations the tool asks for itself, on its
    own task (``asyncio.timeout``, a TaskGroup, anyio's cancel scopes inside httpx), are its
    own business: they are withdrawn (``Task.uncancel``) by the time they are handled, so
    only requests still counted by ``Task.cancelling`` above ``base``, the count the call
    started with, are the call's. None of this costs a step until something is thrown into
    the tool. `time_out` is the call's own timer (`Tool._run_coroutine`): it cancels the
    call's task, as `asyncio.timeout` would, without its context manager's cost.
    """

    __slots__ = ("coro", "signal", "context", "name", "longest", "task", "base", "grace",
                 "timed_out")  # fmt: skip

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any],
        signal: Any,
        context: contextvars.Context,
        name: str,
        first: float,
    ) -> None:
        self.coro, self.signal, self.context, self.name = coro, signal, context, name
        self.longest = first
        self.task = asyncio.current_task()
        self.base = 0 if self.task is None else self.task.cancelling()
        self.grace: asyncio.TimerHandle | _Spent | None = None  # `_OVERDUE` once it is over
        self.timed_out = False

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, signal, run, clock = self.coro, self.signal, self.context.run, time.monotonic
        longest, watch = self.longest, False
        try:
            while True:
                try:
                    sent = yield signal
                except GeneratorExit:
                    coro.close()
                    raise
                except BaseException as exc:  # cancellation, delivered where the tool waits
                    if self.grace is _OVERDUE:
                        self._close(exc)
                    step: Callable[[Any], Any] = coro.throw
                    sent, watch = exc, True
                else:
                    step = coro.send
                began = clock()
                try:
                    signal = run(step, sent)
                except StopIteration as finished:
                    if watch and self._pending():  # it returned from the call's cancellation
                        raise asyncio.CancelledError(f"{self.name!r} was cancelled") from None
                    return finished.value
                except Exception as error:
                    if watch and self._pending():
                        raise asyncio.CancelledError(f"{self.name!r} was cancelled") from error
                    raise
                finally:
                    took = clock() - began
                    if took > longest:
                        longest = took
                if watch:
                    watch = self._keep_watching()
        finally:
            self.longest = longest
            if self.grace is not None:
                self.grace.cancel()

    def time_out(self) -> None:
        """The call's timer: cancel the call (`withdraw_timeout` tells it apart)."""
        if self.task is not None:
            self.timed_out = True
            self.task.cancel()

    def withdraw_timeout(self) -> bool:
        """Withdraw `time_out`'s request, if it made one; whether it alone ended the call.

        As `asyncio.timeout` does: when the caller was cancelled too, its cancellation goes on.
        """
        if not self.timed_out or self.task is None:
            return False
        return self.task.uncancel() <= self.base

    def _pending(self) -> bool:
        """Whether a cancellation of the call (not one the tool asked for) is pending."""
        return self.task is not None and self.task.cancelling() > self.base

    def _keep_watching(self) -> bool:
        """After the tool went on from a cancellation: time its grace while one is pending."""
        if self._pending():
            if self.grace is None:
                loop = asyncio.get_running_loop()
                self.grace = loop.call_later(CANCEL_GRACE_SECONDS, self._end_grace)
            return True
        if self.grace is not None:  # its own cancellation, handled: nothing to time
            self.grace.cancel()
            self.grace = None
        return False

    def _end_grace(self) -> None:
        """The grace is over: wake the call's task, to close the tool (`_close`)."""
        if self.task is not None:
            self.grace = _OVERDUE
            self.task.cancel()

    def _close(self, wake_up: BaseException) -> typing.NoReturn:
        """Close the tool where it waits, and end the call with the cancellation it ignored."""
        assert self.task is not None  # only a task's call is woken up
        self.task.uncancel()  # the wake-up's own request; the call's are still counted
        try:
            self.coro.close()
        except Exception:  # its cleanup awaited ("coroutine ignored GeneratorExit") or failed:
            pass  # the call ends cancelled all the same, or its task's count would be off
        warn_once(
            "closed", self.name,
            "async tool %r was still running %g s after it was cancelled (it swallows "
            "asyncio.CancelledError, or its cleanup waits that long), so it was closed where "
            "it waited and its episode went on. Let CancelledError propagate out of async "
            "tools, and keep cleanup short", self.name, CANCEL_GRACE_SECONDS,
        )  # fmt: skip
        raise wake_up


class _Spent:
    """What `_Resume.grace` holds once a cancelled tool's grace is over: a timer that ran."""

    def cancel(self) -> None:
        """Nothing left to cancel."""


_OVERDUE = _Spent()

_warned: set[tuple[str, str]] = set()


def warn_once(kind: str, name: str, message: str, *args: Any) -> None:
    """Log ``message`` the first time ``name`` (a tool, a reward function) fails in way ``kind``.

    Why once: such code fails on every call, and a run makes thousands of calls.
    """
    if (kind, name) not in _warned:
        _warned.add((kind, name))
        log.warning(message, *args)


_TIMED_OUT = object()  # what the timer settles a sync call's future with


def _expire(running: asyncio.Future[Any]) -> None:
    if not running.done():
        running.set_result(_TIMED_OUT)


class ToolThreads:
    """A cap on the sync tool calls of one owner (an env) that run at once.

    An env owns one, so a busy process never makes one episode's calls wait for another's, and
    waiting for a free slot is not part of a call's timeout. Each call runs on a thread of its
    own, taken warm from the process's idle worker threads or started when none is idle.
    A call whose caller stops waiting (timeout or cancellation) gives its slot back at once;
    its thread cannot be killed and finishes unobserved (see `tool`). Slots are handed over
    with thread-safe callbacks, so one instance serves callers on any event loop.
    """

    def __init__(self, size: int = 8) -> None:
        if size < 1:
            raise ConfigError(f"ToolThreads size must be >= 1, got {size}")
        self.size = size
        self._lock = threading.Lock()
        self._free = size
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        """Take a slot, waiting for one when all ``size`` are held; pair with `release`."""
        with self._lock:
            if self._free:
                self._free -= 1
                return
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            with self._lock:
                if turn in self._waiting:
                    self._waiting.remove(turn)
                    raise
            if not turn.cancelled():  # handed a slot just as the caller gave up: pass it on
                self.release()
            raise  # a cancelled hand-over is passed on by _hand_over

    def release(self) -> None:
        """Give a slot back: to the longest waiting caller, or to the free ones."""
        with self._lock:
            while self._waiting:
                turn = self._waiting.popleft()
                with contextlib.suppress(RuntimeError):  # its loop closed: try the next
                    turn.get_loop().call_soon_threadsafe(self._hand_over, turn)
                    return
            self._free += 1

    def _hand_over(self, turn: asyncio.Future[None]) -> None:
        if turn.cancelled():
            self.release()
        else:
            turn.set_result(None)


#: Seconds an idle worker thread waits for its next call before it exits.
IDLE_THREAD_SECONDS = 30.0

_Job = tuple[Callable[..., Any], dict[str, Any], contextvars.Context, asyncio.AbstractEventLoop,
             "asyncio.Future[Any]"]  # fmt: skip


class _Workers:
    """The process's idle worker threads, each waiting on its own inbox (newest last)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[queue.SimpleQueue[_Job]] = []


_workers = _Workers()
if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's threads

    def _forget_workers() -> None:
        global _workers
        _workers = _Workers()

    os.register_at_fork(after_in_child=_forget_workers)


def _start_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
    """Run ``fn`` on an idle worker thread (a new one when none is idle).

    The future settles on the caller's loop. Workers are daemon threads: one running an
    abandoned call neither holds `asyncio.run` (they are not the loop's default executor) nor
    the interpreter at exit, so such a call cannot hang `rollout` or the CLI. Reusing warm
    threads takes a thread start off every sync call; idle ones exit after
    `IDLE_THREAD_SECONDS`.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    job: _Job = (fn, kwargs, contextvars.copy_context(), loop, future)
    workers = _workers
    with workers.lock:
        inbox = workers.idle.pop() if workers.idle else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        args = (workers, inbox)
        threading.Thread(target=_serve, args=args, name="agentgym-tool", daemon=True).start()
    inbox.put(job)
    return future


def _serve(workers: _Workers, inbox: queue.SimpleQueue[_Job]) -> None:
    """A worker thread: run the calls put in ``inbox``; exit after idling too long."""
    while True:
        try:
            job = inbox.get(timeout=IDLE_THREAD_SECONDS)
        except queue.Empty:
            with workers.lock:
                idle = inbox in workers.idle
                if idle:
                    workers.idle.remove(inbox)
            if idle:
                return
            job = inbox.get()  # handed a call just as the wait ended: run it
        fn, kwargs, context, loop, future = job
        del job
        threading.current_thread().name = f"agentgym-tool-{getattr(fn, '__name__', 'fn')}"
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(fn, **kwargs), None)
        except BaseException as exc:  # delivered to the caller like to_thread does
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, future, *outcome)
        del fn, kwargs, context, loop, future, outcome  # an idle thread holds no call's data
        with workers.lock:
            workers.idle.append(inbox)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # abandoned: the caller timed out or was cancelled
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


async def cancel_and_wait(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel what is still running and wait until it has stopped, outcomes discarded.

    Waiting is what makes cancellation complete: a tool's cleanup (``finally``, releasing a
    sandbox) has run when this returns, not at some later point of the loop.
    """
    pending = {f for f in futures if not f.done()}
    for future in pending:
        future.cancel()
    if pending:
        await asyncio.wait(pending)
    for future in pending:
        if not future.cancelled():
            future.exception()  # retrieved: no "exception was never retrieved" warning


def _described_function(fn: Any) -> Callable[..., Any]:
    """The function whose signature and docstring describe ``fn``: itself, or its ``__call__``.

    An object with a ``__call__`` method (a tool holding state, such as an index) is described
    by that method, bound, so ``self`` is not a parameter. Anything else that is not a function
    (a class, a ``functools.partial``, a builtin) has no hints to build a schema from.
    """
    if inspect.isroutine(fn) and not inspect.isbuiltin(fn):
        return fn
    call = inspect.getattr_static(type(fn), "__call__", None)
    if not inspect.isclass(fn) and inspect.isfunction(call):
        return typing.cast(Callable[..., Any], fn.__call__)
    raise ConfigError(
        f"tool() needs a function, a method or an object with a __call__ method, got "
        f"{shown(fn)}; wrap it in a def with type hints"
    )


def shown(value: Any) -> str:
    """A value as error messages quote it: its type and a repr cut short."""
    return "None" if value is None else f"{type(value).__name__} {reprlib.repr(value)}"


def _check_signature(label: str, fn: Callable[..., Any], hints: Mapping[str, Any]) -> None:
    """Refuse parameters the model could not be shown, each with the way out."""
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise ConfigError(
            f"tool {label!r} is a generator function (it yields); a tool call returns one "
            "result: collect the items and return them, e.g. as a list"
        )
    for position, (pname, param) in enumerate(inspect.signature(fn).parameters.items()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigError(f"tool {label!r}: *args/**kwargs cannot be described to a model")
        if pname in INJECTABLE or pname in hints:
            continue
        if position == 0 and pname in ("self", "cls"):  # @tool on a method in a class body
            raise ConfigError(
                f"tool {label!r}: parameter {pname!r} has no type hint because @tool got the "
                f"method unbound; decorate a plain function, or wrap the bound method once "
                f"the object exists: tool(obj.{getattr(fn, '__name__', label)})"
            )
        raise ConfigError(
            f"tool {label!r}: parameter {pname!r} needs a type hint to build its schema"
        )


def _build_tool(
    fn: Callable[..., Any], name: str | None, description: str | None, timeout: float | None
) -> Tool:
    described = _described_function(fn)
    label = getattr(fn, "__name__", None) or type(fn).__name__
    doc = docstring_parser.parse(inspect.getdoc(described) or "")
    param_docs = {p.arg_name: p.description for p in doc.params}
    try:
        hints = typing.get_type_hints(described, include_extras=True)
    except NameError as exc:
        raise ConfigError(
            f"tool {label!r}: cannot resolve its type hints ({exc}); "
            "define the types at module level"
        ) from exc
    _check_signature(label, described, hints)
    params = inspect.signature(described).parameters
    shown = {p: hints[p] for p in params if p not in INJECTABLE}
    properties, defs, adapters = _parameter_schemas(f"tool {label!r}", shown)
    required = []
    for pname, prop in properties.items():
        if param_docs.get(pname):
            prop["description"] = param_docs[pname]
        default = params[pname].default
        if default is inspect.Parameter.empty:
            required.append(pname)
        elif default is not None:
            with contextlib.suppress(pydantic_core.PydanticSerializationError):
                prop["default"] = adapters[pname].dump_python(default, mode="json", warnings=False)
    summary = "\n\n".join(p for p in (doc.short_description, doc.long_description) if p)
    parameters = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        **({"$defs": defs} if defs else {}),
    }
    return Tool(
        fn=fn,
        name=name or label,
        description=description or summary,
        parameters=parameters,
        injected=frozenset(params.keys() & INJECTABLE),
        timeout=timeout,
        is_async=inspect.iscoroutinefunction(described),
        converters={
            p: adapters[p].validate_python for p, hint in shown.items() if not _arrives_as_is(hint)
        },
    )


@typing.overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@typing.overload
def tool(
    *, name: str | None = None, description: str | None = None, timeout: float | None = 30.0
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = 30.0,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a `Tool`; usable bare (``@tool``) or with options.

    Args:
        fn: the function; its docstring's summary becomes the description and its
            ``Args:`` section the parameter descriptions. A method must be bound
            (``tool(obj.method)``, not ``@tool`` in the class body). An object with a
            ``__call__`` method is described by that method and named after its class.
        name: the name the model calls; defaults to the function's name.
        description: overrides the docstring summary.
        timeout: seconds per call (> 0) before the model gets a timeout message; None
            disables it. The clock starts when the call starts running, not while it waits
            for a thread.

    Async functions run on the episode's event loop; when the call times out or the episode
    is cancelled they are cancelled, and their cleanup has run before the episode goes on,
    unless it takes more than `CANCEL_GRACE_SECONDS` (1 s): then the coroutine is closed
    where it waits (its ``finally`` blocks run) and one warning names the tool, so a tool that
    swallows `asyncio.CancelledError` cannot hang its episode, `rollout` or ``agentgym eval``. An
    async function must not block: one that holds the event loop past its timeout (``time.sleep``
    in an ``async def``) is timed out all the same, even if it returned, and the model's
    message and a warning say it blocked the loop.
    Sync functions run on a thread of their own, at most `ToolEnv.max_tool_threads` of an
    episode at once. A thread cannot be killed: when its call times out or the episode is
    cancelled, the model is told at once and the episode moves on, while the thread runs on
    until the function returns, and its result is dropped. It no longer counts against the
    env's threads, does not hold ``rollout()`` or ``agentgym eval`` (they return without
    waiting), and does not keep the process alive at exit (it is a daemon thread, stopped
    wherever it is). So a sync tool that may hang, or whose side effects must stop with the
    episode, belongs in a sandbox or an async function.
    """
    if fn is not None:
        return _build_tool(fn, name, description, timeout)
    return functools.partial(_build_tool, name=name, description=description, timeout=timeout)


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """Accept either a `Tool` or a plain function (wrapped with default options)."""
    return obj if isinstance(obj, Tool) else tool(obj)


_EXAMPLES = {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}


def example_arguments(parameters: dict[str, Any]) -> dict[str, Any]:
    """Arguments that satisfy a tool's schema: its required fields, each with a simple value."""
    return {
        name: _example(parameters["properties"][name]) for name in parameters.get("required", [])
    }


def _example(prop: dict[str, Any]) -> Any:
    if "enum" in prop:
        return prop["enum"][0]
    kind = prop.get("type")
    if isinstance(kind, list):  # Optional[T] is ["T", "null"]
        kind = kind[0]
    if kind is None and prop.get("anyOf"):
        return _example(prop["anyOf"][0])
    return _EXAMPLES.get(kind, "x") if isinstance(kind, str) else "x"


_BYTES = (bytes, bytearray, memoryview)


#: What a memory address looks like in a repr (``<__main__.O object at 0x7f35...>``).
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


class _Opaque(Exception):
    """Raised out of `json.dumps` for a value whose only text is its memory address."""

    def __init__(self, value: Any) -> None:
        super().__init__(type(value).__name__)
        self.value = value


def format_result(value: Any, tool_name: str | None = None) -> str:
    """Render a tool's return value as the text of a ``tool`` message.

    A str is the text itself, bytes too when they are UTF-8 (else a note of their length:
    the model cannot read binary). Anything else is written as JSON: pydantic models as
    their JSON data, not their repr, and floats JSON has no number for (NaN, Infinity,
    -Infinity) as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, so the text stays
    valid JSON without losing what the value was. Values JSON cannot carry fall back to
    their str (a date, a set, a dataclass), except those whose str shows a memory address
    (an object without a ``__repr__``, a function): it differs in every run, so an episode
    could not be replayed, and it tells the model nothing. Such a result raises `ToolError`
    naming its type, for the model to read and the tool's author to fix (``tool_name``
    names the tool in the message).
    """
    if isinstance(value, str):
        return value
    if type(value) is int:  # what json.dumps writes, without its encoder set-up
        return int.__repr__(value)
    if isinstance(value, _BYTES):
        return _bytes_text(value)
    try:
        return _json_text(value)
    except _Opaque as opaque:
        what = type(opaque.value).__name__
        holding = "a" if opaque.value is value else "data holding a"
        raise ToolError(
            f"{'the tool' if tool_name is None else repr(tool_name)} returned {holding} {what}, "
            "which is not JSON data (its text would be a memory address); the tool must "
            "return a str or JSON data (dict, list, str, int, float, bool, None)"
        ) from None


def _json_text(value: Any) -> str:
    """``value`` as JSON text, or as its str when JSON cannot write it (a dict's tuple key)."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=_json_data)
    except (TypeError, ValueError):
        return _plain_text(value)
    if "NaN" in text or "Infinity" in text:  # maybe a float JSON has no number for: quote it
        text = json.dumps(json.loads(text, parse_constant=str), ensure_ascii=False)
    return text


def _json_data(value: Any) -> Any:
    """`json.dumps`'s fallback for what it cannot write itself."""
    if isinstance(value, _BYTES):
        return _bytes_text(value)
    if isinstance(value, pydantic.BaseModel):
        try:
            return value.model_dump(mode="json")
        except ValueError:  # a field pydantic cannot write as JSON (bytes that are not UTF-8)
            return value.model_dump()  # whose values come back here
    return _plain_text(value)


def _plain_text(value: Any) -> str:
    """``str(value)``; raises `_Opaque` when that shows a memory address (see `format_result`)."""
    text = str(value)
    if _ADDRESS.search(text) is not None:
        raise _Opaque(value)
    return text


def _bytes_text(data: bytes | bytearray | memoryview) -> str:
    raw = bytes(data)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(raw)} bytes of binary data, not UTF-8 text>"
