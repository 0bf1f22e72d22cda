"""Tools: plain Python functions the model may call, with an OpenAI JSON schema.

The schema comes from the signature's type hints and the docstring (Google, NumPy or reST
style), so a tool is written once. Parameters the *environment* supplies (a sandbox handle,
the task, the episode state) are injected by name and never appear in the schema: the model
cannot see or forge them.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import json
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
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
    if origin in (list, tuple, set, frozenset, typing.Sequence, typing.Iterable):
        schema: dict[str, Any] = {"type": "array"}
        if args:
            schema["items"] = type_to_schema(args[0])
        return schema
    if origin in (dict, Mapping, typing.Mapping):
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
        self, arguments: dict[str, Any], context: Mapping[str, Any] | None = None
    ) -> Any:
        """Validate, inject and run; raise a `ToolError` subclass on any failure."""
        self.validate(arguments)
        kwargs = {
            k: (self.converters[k](v) if k in self.converters and v is not None else v)
            for k, v in arguments.items()
        }
        for name in self.injected:
            kwargs[name] = (context or {}).get(name)
        if self.is_async:
            call: Awaitable[Any] = self.fn(**kwargs)
        else:
            call = asyncio.to_thread(self.fn, **kwargs)
        running = asyncio.ensure_future(call)
        # asyncio.wait (not wait_for) so a TimeoutError the tool raises itself stays its own
        done, _ = await asyncio.wait({running}, timeout=self.timeout)
        if not done:
            running.cancel()
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
        enum_type = _enum_type(hints[pname])
        if enum_type is not None:
            converters[pname] = enum_type
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


def _enum_type(annotation: Any) -> type[enum.Enum] | None:
    """The Enum class behind ``E`` or ``Optional[E]``, so arguments arrive as members."""
    candidates = [annotation, *get_args(annotation)]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, enum.Enum)), None)


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
