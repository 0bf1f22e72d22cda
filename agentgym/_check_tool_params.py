"""The ``tool parameters`` row of `agentgym check`: each tool's docstring against its signature.

Why a row of its own: a mismatch is silent at run time. The model is shown a schema without
the description its author wrote, or never gets to give a parameter that the env fills in.
"""

from __future__ import annotations

import enum
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import docstring_parser

from ._check_result import CheckResult
from ._env import Env
from ._errors import ConfigError
from ._tools import Tool, _described_function

#: What the env fills each injected name with, for messages (`ToolEnv.tool_context`).
_FILLED_WITH = {
    "task": "the env's task dict",
    "state": "the episode's state",
    "messages": "the conversation so far",
    "env": "the env itself",
    "sandbox": "the episode's sandbox",
}
#: Annotations of a value a model sends: never what the env injects under any name.
_MODEL_VALUES = (str, int, float, bool, bytes)


@dataclass
class _Described:
    """A tool whose schema was built from its function: the signature and the Args: lines."""

    tool: Tool
    params: Mapping[str, inspect.Parameter]
    docs: dict[str, str]
    hints: dict[str, Any]


def tool_parameters(env: Env) -> CheckResult:
    """Each tool's docstring against its signature, and its injected parameters.

    A documented parameter the function lacks (``town`` documented, ``city`` taken) means
    the model is shown a schema without the description the author wrote. A parameter
    named like an injected one (`agentgym._tools.INJECTABLE`: ``task``, ``state`` ...) is
    filled by the env and hidden from the model, by design; documented in ``Args:`` (unless
    its line says it is injected) or annotated as a value the model would send, it was
    meant as the model's argument, and the model can never give it. Parameters with no
    description are named, all of them, without failing the check (a clear name may do).
    Tools built from a raw schema (MCP, OpenAPI) have no signature to compare.
    """
    tools = list(getattr(env, "tools", {}).values())
    env.close()
    described = [d for d in map(_described, tools) if d is not None]
    problems = [p for d in described for p in _parameter_problems(d)]
    undocumented = [
        f"{d.tool.name!r} ({', '.join(names)})"
        for d in described
        if (names := [p for p in d.params if p not in d.docs and p not in d.tool.injected])
    ]
    detail = "; ".join(problems) or f"{len(described)} tool(s) built from functions checked"
    if undocumented:
        detail += f"; parameters with no description: {'; '.join(undocumented)}"
    return CheckResult("tool parameters", not problems, detail)


def _described(tool: Tool) -> _Described | None:
    """The signature and docstring a tool's schema was built from; None for a raw schema."""
    try:
        fn = _described_function(tool.fn)
        params = inspect.signature(fn).parameters
    except (ConfigError, TypeError, ValueError):  # a builtin, a partial: no signature
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None  # a wrapper around a raw schema (MCP, OpenAPI): **arguments
    docs = {
        p.arg_name: p.description or ""
        for p in docstring_parser.parse(inspect.getdoc(fn) or "").params
        if p.args[0] != "attribute"
    }
    return _Described(tool, params, docs, _hints(fn))


def _parameter_problems(d: _Described) -> list[str]:
    """Stray Args: entries and injected parameters meant for the model (see above)."""
    problems = []
    if stray := [name for name in d.docs if name not in d.params]:
        shown = ", ".join(repr(p) for p in d.params if p not in d.tool.injected) or "none"
        problems.append(
            f"tool {d.tool.name!r}: its docstring's Args: documents "
            f"{', '.join(map(repr, stray))}, which it does not take (its parameters: {shown}); "
            "make the names match"
        )
    problems += _schema_misfits(d)
    for name in sorted(d.tool.injected & d.params.keys()):
        hint = d.hints.get(name, Any)
        if why := _meant_for_the_model(name, d.docs.get(name), hint):
            only_the_doc = _injectable_hint(name, hint)
            problems.append(
                f"tool {d.tool.name!r}: parameter {name!r} is {why}, as if the model gave it, "
                f"but the model never sees it: {name!r} is filled with "
                f"{_FILLED_WITH.get(name, 'a value of the env')}; rename it"
                + (", or say '(injected)' on its Args: line" if only_the_doc else "")
            )
    return problems


def _schema_misfits(d: _Described) -> list[str]:
    """A schema given by hand (``Tool(fn, parameters=...)``) against its function's names.

    Why: a schema offering ``x, y`` for a function taking ``a, b`` passed the check; every
    call the schema allowed then failed with a TypeError, counted as the model's tool error.
    """
    offered = set((d.tool.parameters or {}).get("properties") or {})
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    takes = {n for n, p in d.params.items() if n not in d.tool.injected and p.kind not in kinds}
    problems = []
    if unknown := sorted(offered - takes):
        problems.append(
            f"tool {d.tool.name!r}: its schema offers {', '.join(map(repr, unknown))}, which "
            f"its function does not take (it takes {', '.join(map(repr, sorted(takes))) or 'none'})"
            "; every call the schema allows would fail: make the names match"
        )
    needed = sorted(n for n in takes - offered if d.params[n].default is inspect.Parameter.empty)
    if needed:
        problems.append(
            f"tool {d.tool.name!r}: its function needs {', '.join(map(repr, needed))}, which "
            "its schema never asks the model for: add them to the schema's properties"
        )
    return problems


def _meant_for_the_model(name: str, doc: str | None, hint: Any) -> str:
    """How an injected parameter looks like the model's argument; "" when it does not."""
    signs = []
    if doc is not None and "inject" not in doc.lower():
        signs.append(f"documented in Args: ({doc!r})")
    if not _injectable_hint(name, hint):
        signs.append(f"annotated {hint.__name__ if isinstance(hint, type) else hint}")
    return " and ".join(signs)


def _injectable_hint(name: str, hint: Any) -> bool:
    """Whether ``hint`` can describe what the env injects under ``name``.

    ``task`` is a dict (a mapping type, a TypedDict, Any); no injected value is a string,
    number, bool, Literal or Enum: the values a model sends.
    """
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _injectable_hint(name, typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return all(_injectable_hint(name, a) for a in typing.get_args(hint) if a is not type(None))
    base = origin or hint
    if hint is Any or base is object:
        return True
    if base is typing.Literal:
        return False
    if not isinstance(base, type):  # a TypeVar, a NewType ...: given the benefit of the doubt
        return True
    if name == "task":
        return issubclass(base, Mapping)  # dict, Mapping, a TypedDict
    return not issubclass(base, (*_MODEL_VALUES, enum.Enum))


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s resolved annotations; none where they do not resolve (they are not checked)."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # a forward reference only a type checker resolves
        return {}
