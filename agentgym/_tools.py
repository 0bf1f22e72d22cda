"""Tools: plain Python functions the model may call, with an OpenAI JSON schema.

The schema comes from the signature's type hints and the docstring (Google, NumPy or reST
style), so a tool is written once. Parameters the *environment* supplies (a sandbox handle,
the task, the episode state) are injected by name and never appear in the schema: the model
cannot see or forge them.

Pydantic writes each parameter's schema (`_tool_schema`), so a tool may take what real APIs
take: pydantic models, dataclasses and TypedDicts (nested, in lists), dates, enums, unions and
Literals. A call is checked in two steps. First against the schema the model was shown (the
contract). Then pydantic turns the JSON values into the declared types and checks what a
schema cannot say (a date's format, a model's own validators); parameters whose JSON value
already is the declared type (``str``, ``list[int]`` ...) skip it. Then it runs under its
timeout (`_tool_calls`), and its result becomes the model's text (`_tool_results`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import numbers
import reprlib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import docstring_parser
import jsonschema
import pydantic
import pydantic_core
import referencing.exceptions

from ._errors import ConfigError, InfraError, ToolArgumentsError, ToolError
from ._tool_calls import (
    ToolThreads,
    call_failure,
    cancellations,
    describe_failure,
    run_coroutine,
    run_in_thread,
)
from ._tool_schema import (
    UnresolvedRef,
    arrives_as_is,
    checked_schema,
    checked_schema_of,
    describe_error,
    not_unicode,
    parameter_schemas,
    whole_floats_as_ints,
)

#: Parameter names the environment fills in; a tool that declares one gets it injected.
INJECTABLE = frozenset({"task", "state", "sandbox", "messages", "env"})


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
            try:
                text = json.dumps(self.parameters, sort_keys=True)
            except (TypeError, ValueError):  # not JSON (a default of another type): as is
                self._validator, self._surely_valid = checked_schema_of(self.parameters)
            else:  # once per schema text, $refs included: envs rebuild their tools
                self._validator, self._surely_valid = checked_schema(text)
        except jsonschema.SchemaError as exc:  # jsonschema's own 11 lines named no tool
            where = "/".join(map(str, exc.path))
            raise ConfigError(
                f"tool {self.name!r}: its parameters are not a JSON schema "
                f"(parameters{'/' + where if where else ''}: {exc.message})"
            ) from exc
        except UnresolvedRef as exc:  # every call of the tool would crash the episode
            raise ConfigError(
                f"tool {self.name!r}: its parameters{'/' + exc.where if exc.where else ''} "
                f"refer to $ref {exc.ref!r}, which does not resolve ({exc.why}); define it in "
                "the schema (under $defs) or inline it"
            ) from exc

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

    def validate(self, arguments: Any) -> dict[str, Any]:
        """``arguments`` as the tool takes them, or `ToolArgumentsError` naming each violation.

        A whole float where an integer is due (JSON Schema's 5.0) comes back an int.
        """
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(
                f"arguments for {self.name!r} must be a JSON object, got {type(arguments).__name__}"
            )
        broken = not_unicode(arguments)
        if broken is not None:
            raise ToolArgumentsError(
                f"invalid arguments for {self.name!r}: {broken} holds a lone surrogate (an "
                "escape such as \\ud800 that is not a character); send text only"
            )
        if self._surely_valid is not None and self._surely_valid(arguments):
            return arguments
        try:
            problems = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        except referencing.exceptions.Unresolvable as exc:  # not the model's mistake
            # kept although the build refuses a `$ref` that does not resolve (`UnresolvedRef`):
            # that check follows plain `$ref`s only, not a `$dynamicRef`
            raise ToolError(
                f"{self.name!r} cannot check its arguments: its schema's $ref does not resolve "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        if problems:
            details = "; ".join(
                f"{'/'.join(map(str, p.path)) or 'arguments'}: {p.message}" for p in problems
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name!r}: {details}")
        return typing.cast(dict[str, Any], whole_floats_as_ints(arguments, self.parameters))

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
        arguments = self.validate(arguments)
        kwargs = self._convert(arguments) if self.converters else dict(arguments)
        for name in self.injected:
            kwargs[name] = (context or {}).get(name)
        pending = cancellations()
        try:
            if self.is_async:
                return await run_coroutine(self.fn, kwargs, self.name, self.timeout)
            threads = threads or ToolThreads(1)
            await threads.acquire()  # waiting for a slot is not timed
            try:
                return await run_in_thread(self.fn, kwargs, self.name, self.timeout)
            finally:
                threads.release()
        except (ToolError, InfraError):
            raise
        except BaseException as exc:
            failure = call_failure(exc, pending)
            if failure is None:  # Ctrl-C, or the episode's cancellation
                raise
            raise ToolError(f"{self.name!r} raised {describe_failure(failure)}") from failure

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
                    problems = "; ".join(describe_error(name, e) for e in exc.errors())
                    raise ToolArgumentsError(
                        f"invalid arguments for {self.name!r}: {problems}"
                    ) from exc
                except Exception as exc:
                    raise ToolArgumentsError(
                        f"invalid arguments for {self.name!r}: {type(exc).__name__}: {exc}"
                    ) from exc
        return kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (no validation), as a plain function."""
        return self.fn(*args, **kwargs)


def check_timeout(timeout: Any, what: str, none_means: str = "no limit") -> None:
    """Refuse a timeout that is not a positive number of seconds.

    Zero or less would time out every call before it runs, so every episode would see only
    timeout messages; None says what ``none_means`` ("no limit" for a tool's own).
    """
    is_seconds = isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
    if timeout is not None and not (is_seconds and timeout > 0):
        raise ConfigError(
            f"{what} must be a number of seconds > 0, or None for {none_means}; got {timeout!r}"
        )


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
            raise ConfigError(f"tool {label!r}: *args/**kwargs cannot be described to a model; "
                              "give each argument a typed parameter of its own")  # fmt: skip
        if param.kind is param.POSITIONAL_ONLY:  # every call raised TypeError, blamed on the model
            raise ConfigError(
                f"tool {label!r}: parameter {pname!r} is positional-only (before '/'), and a "
                "model's arguments arrive by name; remove the '/'"
            )
        if pname in INJECTABLE or pname in hints:
            continue
        if position == 0 and pname in ("self", "cls"):  # @tool on a method in a class body
            raise ConfigError(
                f"tool {label!r}: parameter {pname!r} has no type hint because @tool got the "
                f"method unbound; decorate a plain function, or wrap the bound method once "
                f"the object exists: tool(obj.{getattr(fn, '__name__', label)})"
            )
        raise ConfigError(
            f"tool {label!r}: parameter {pname!r} needs a type hint to build its schema "
            f"(e.g. {pname}: str)"
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
    properties, defs, adapters = parameter_schemas(f"tool {label!r}", shown)
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
        # through functools.wraps: a sync decorator (logging, retry) over an async tool
        # returns its coroutine, which ran on a thread and was never awaited
        is_async=inspect.iscoroutinefunction(inspect.unwrap(described)),
        converters={
            p: adapters[p].validate_python for p, hint in shown.items() if not arrives_as_is(hint)
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
