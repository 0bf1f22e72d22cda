"""Tools: plain Python functions the model may call, with an OpenAI JSON schema.

The schema comes from the signature's type hints and the docstring (Google, NumPy or reST
style), so a tool is written once. Parameters the *environment* supplies (a sandbox handle,
the task, the episode state) are injected by name and never appear in the schema: the model
cannot see or forge them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import functools
import inspect
import json
import threading
import types
import typing
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

import docstring_parser
import jsonschema

from ._errors import ConfigError, InfraError, ToolArgumentsError, ToolError, ToolTimeoutError

#: Parameter names the environment fills in; a tool that declares one gets it injected.
INJECTABLE = frozenset({"task", "state", "sandbox", "messages", "env"})

_PRIMITIVES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    dict: {"type": "object"},
    list: {"type": "array"},
    Any: {},
}

#: Generic origins that JSON carries as an array, and as an object.
_ARRAYS = (list, tuple, set, frozenset, Sequence, Iterable)
_MAPPINGS = (dict, Mapping)


def type_to_schema(annotation: Any) -> dict[str, Any]:
    """JSON schema for a Python type hint; raises `ConfigError` for types JSON cannot carry."""
    if annotation in _PRIMITIVES:
        return dict(_PRIMITIVES[annotation])
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is typing.Annotated:
        return type_to_schema(args[0])
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:  # Optional[T]: T or an explicit null
            inner = type_to_schema(non_null[0])
            if isinstance(inner.get("type"), str):
                return {**inner, "type": [inner["type"], "null"]}
            if "enum" in inner:
                return {**inner, "enum": [*inner["enum"], None]}
            return {"anyOf": [inner, {"type": "null"}]}
        return {"anyOf": [type_to_schema(a) for a in args]}
    if origin in _ARRAYS:
        schema: dict[str, Any] = {"type": "array"}
        if args:
            schema["items"] = type_to_schema(args[0])
        return schema
    if origin in _MAPPINGS:
        schema = {"type": "object"}
        if len(args) == 2:
            schema["additionalProperties"] = type_to_schema(args[1])
        return schema
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [member.value for member in annotation]}
    raise ConfigError(
        f"cannot turn type hint {annotation!r} into a JSON schema; "
        "use str, int, float, bool, list[...], dict[str, ...], Literal[...] or an Enum"
    )


@dataclass
class Tool:
    """A callable the model may invoke, with its OpenAI function schema.

    Build one with the `tool` decorator. Calling `Tool.acall` validates the model's arguments
    against `parameters`, adds the injected ones, and runs the function under `timeout`:
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

    def __post_init__(self) -> None:
        jsonschema.Draft202012Validator.check_schema(self.parameters)
        self._validator = jsonschema.Draft202012Validator(self.parameters)

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
        sees `asyncio.CancelledError` and has finished when this returns; a sync tool's
        thread is abandoned (see `tool`).
        """
        self.validate(arguments)
        kwargs = self._convert(arguments)
        for name in self.injected:
            kwargs[name] = (context or {}).get(name)
        if self.is_async:
            return await self._await_result(asyncio.ensure_future(self.fn(**kwargs)))
        async with (threads or ToolThreads(1)).slot():  # waiting for a slot is not timed
            return await self._await_result(_start_thread(self.fn, kwargs))

    def _convert(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Schema-valid JSON arguments as the Python values the hints ask for (Enum members).

        A converter that fails (a custom one, or a value the schema let through) is the
        model's mistake to read about, so it becomes `ToolArgumentsError`, never a crash.
        """
        try:
            return {
                k: self.converters[k](v) if k in self.converters and v is not None else v
                for k, v in arguments.items()
            }
        except Exception as exc:
            raise ToolArgumentsError(
                f"invalid arguments for {self.name!r}: {type(exc).__name__}: {exc}"
            ) from exc

    async def _await_result(self, running: asyncio.Future[Any]) -> Any:
        """Wait up to `timeout` for a started call and map its failure to a `ToolError`.

        Whenever this stops waiting (timeout, or its caller cancelled), the call is cancelled
        and, for an async tool, awaited, so nothing of it runs on after this returns.
        """
        try:
            # asyncio.wait (not wait_for) so a TimeoutError the tool raises itself stays its own
            done, _ = await asyncio.wait({running}, timeout=self.timeout)
        finally:
            await cancel_and_wait([running])
        if not done:
            raise ToolTimeoutError(f"{self.name!r} timed out after {self.timeout:g} s")
        try:
            return running.result()
        except (ToolError, InfraError):
            raise
        except Exception as exc:
            raise ToolError(f"{self.name!r} raised {type(exc).__name__}: {exc}") from exc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (no validation), as a plain function."""
        return self.fn(*args, **kwargs)


class ToolThreads:
    """Threads for sync tools: at most ``size`` calls run at once, each on a thread of its own.

    An env owns one, so a busy process never makes one episode's calls wait for another's, and
    waiting for a free slot is not part of a call's timeout. A call whose caller stops waiting
    (timeout or cancellation) gives its slot back at once; its thread cannot be killed and
    finishes unobserved (see `tool`). Slots are handed over with thread-safe callbacks, so one
    instance serves callers on any event loop.
    """

    def __init__(self, size: int = 8) -> None:
        if size < 1:
            raise ConfigError(f"ToolThreads size must be >= 1, got {size}")
        self.size = size
        self._lock = threading.Lock()
        self._free = size
        self._waiting: deque[asyncio.Future[None]] = deque()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the ``size`` slots for the body."""
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
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
                self._release()
            raise  # a cancelled hand-over is passed on by _hand_over

    def _release(self) -> None:
        with self._lock:
            while self._waiting:
                turn = self._waiting.popleft()
                with contextlib.suppress(RuntimeError):  # its loop closed: try the next
                    turn.get_loop().call_soon_threadsafe(self._hand_over, turn)
                    return
            self._free += 1

    def _hand_over(self, turn: asyncio.Future[None]) -> None:
        if turn.cancelled():
            self._release()
        else:
            turn.set_result(None)


def _start_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
    """Run ``fn`` on a new daemon thread; the future settles on the caller's loop.

    A daemon thread neither holds `asyncio.run` (it is not the loop's default executor) nor
    the interpreter at exit, so an abandoned call cannot hang `rollout` or the CLI.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def work() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(fn, **kwargs), None)
        except BaseException as exc:  # delivered to the caller like to_thread does
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, future, *outcome)

    name = f"agentgym-tool-{getattr(fn, '__name__', 'fn')}"
    threading.Thread(target=work, name=name, daemon=True).start()
    return future


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


def _build_tool(
    fn: Callable[..., Any], name: str | None, description: str | None, timeout: float | None
) -> Tool:
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    param_docs = {p.arg_name: p.description for p in doc.params}
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise ConfigError(
            f"tool {fn.__name__!r}: cannot resolve its type hints ({exc}); "
            "define the types at module level"
        ) from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    injected: set[str] = set()
    converters: dict[str, Callable[[Any], Any]] = {}
    for pname, param in inspect.signature(fn).parameters.items():
        if pname in INJECTABLE:
            injected.add(pname)
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigError(
                f"tool {fn.__name__!r}: *args/**kwargs cannot be described to a model"
            )
        if pname not in hints:
            raise ConfigError(
                f"tool {fn.__name__!r}: parameter {pname!r} needs a type hint to build its schema"
            )
        prop = type_to_schema(hints[pname])
        if param_docs.get(pname):
            prop["description"] = param_docs[pname]
        convert = _converter(hints[pname])
        if convert is not None:
            converters[pname] = convert
        if param.default is not inspect.Parameter.empty:
            if param.default is not None:
                default = param.default
                prop["default"] = default.value if isinstance(default, enum.Enum) else default
        else:
            required.append(pname)
        properties[pname] = prop
    summary = "\n\n".join(p for p in (doc.short_description, doc.long_description) if p)
    parameters = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return Tool(
        fn=fn,
        name=name or fn.__name__,
        description=description or summary,
        parameters=parameters,
        injected=frozenset(injected),
        timeout=timeout,
        is_async=inspect.iscoroutinefunction(fn),
        converters=converters,
    )


def _converter(annotation: Any) -> Callable[[Any], Any] | None:
    """How a schema-valid JSON value becomes what ``annotation`` asks for; None: it already is.

    Enum members are built from their values, also inside lists, dicts and unions, so a
    ``list[Color]`` parameter gets ``[Color.RED]`` for ``["red"]``.
    """
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is typing.Annotated:
        return _converter(args[0])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation
    if origin in (Union, types.UnionType):
        options = [c for c in map(_converter, args) if c is not None]
        return functools.partial(_first_fit, options) if options else None
    if origin in _ARRAYS and args:
        item = _converter(args[0])
        return functools.partial(_each_item, item) if item else None
    if origin in _MAPPINGS and len(args) == 2:
        value = _converter(args[1])
        return functools.partial(_each_value, value) if value else None
    return None


def _first_fit(options: list[Callable[[Any], Any]], value: Any) -> Any:
    """The first conversion that takes ``value``, else ``value`` unchanged.

    Unchanged is right: the schema already matched it to one of the union's other members
    (``None`` for Optional).
    """
    for convert in options:
        try:
            return convert(value)
        except (ValueError, TypeError, AttributeError):
            continue
    return value


def _each_item(convert: Callable[[Any], Any], values: list[Any]) -> list[Any]:
    return [convert(v) for v in values]


def _each_value(convert: Callable[[Any], Any], values: dict[str, Any]) -> dict[str, Any]:
    return {k: convert(v) for k, v in values.items()}


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
            ``Args:`` section the parameter descriptions.
        name: the name the model calls; defaults to the function's name.
        description: overrides the docstring summary.
        timeout: seconds per call before the model gets a timeout message; None disables it.
            The clock starts when the call starts running, not while it waits for a thread.

    Async functions run on the episode's event loop; when the call times out or the episode
    is cancelled they are cancelled, and their cleanup has run before the episode goes on.
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


def format_result(value: Any) -> str:
    """Render a tool's return value as the text of a ``tool`` message."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)
