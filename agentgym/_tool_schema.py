"""What a model is shown about a tool, and the first check of what it sends back.

Pydantic writes each parameter's JSON schema from its type hint, tidied for a model to read
(`$defs` inlined except where a type refers to itself, no titles). A call's arguments are
then checked against that schema, the contract the model saw: a compiled check for the usual
simple schemas (`_fast_schema`), else jsonschema, which also checks tools built from a raw
schema (MCP, OpenAPI). `Tool` (in `_tools`) puts these together.
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

import jsonschema
import pydantic
import referencing
import referencing.exceptions
import referencing.jsonschema

from ._errors import ConfigError
from ._fast_schema import compile_fast_check

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


def parameter_schemas(
    owner: str, hints: Mapping[str, Any]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, pydantic.TypeAdapter[Any]]]:
    """Each parameter's tidy schema, the `$defs` they still share, and pydantic's adapters.

    Raises `ConfigError` for a type JSON cannot carry (``owner`` names the tool in it).
    """
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
    """``node`` with `$ref`s inlined (``keep`` gets those that recur) and titles dropped.

    Objects of named fields are closed to other keys, unless they say otherwise.
    """
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
    if "properties" in tidy and "additionalProperties" not in tidy:
        # a dataclass's, TypedDict's or model's fields, closed as the top level is: pydantic
        # drops an unknown key, so a model's typo ("Limit") ran with the default silently
        tidy["additionalProperties"] = False
    return tidy


def arrives_as_is(annotation: Any) -> bool:
    """Whether every schema-valid JSON value already is what ``annotation`` asks for.

    Such parameters skip pydantic on each call. Anything else (Annotated validators, enums,
    dates, models, tuples ...) is converted, and checked, by pydantic.
    """
    if any(annotation is t for t in _AS_DECODED):
        return True
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return all(type(a) in (str, int, bool, type(None)) for a in args)
    if origin in (dict, Mapping) and args and args[0] not in (str, Any):
        return False  # JSON keys are strings: a dict[int, str] needs pydantic to make them ints
    return origin in _AS_DECODED_ORIGINS and all(map(arrives_as_is, args))


class UnresolvedRef(Exception):
    """A ``$ref`` in a schema that does not resolve; `Tool` makes it a `ConfigError`.

    It names no tool: the schema checks are cached by schema text, which tools may share.
    """

    def __init__(self, where: str, ref: str, why: str) -> None:
        super().__init__(f"{where or '(top)'}: $ref {ref!r} does not resolve ({why})")
        #: Where the ref is (``properties/x``; "" at the top), the ref, and why it fails.
        self.where, self.ref, self.why = where, ref, why


@functools.lru_cache(maxsize=1024)
def checked_schema(text: str) -> tuple[Any, Callable[[Any], bool] | None]:
    """`checked_schema_of` the schema whose canonical JSON is ``text``, once per schema.

    Envs build their tools again for every instance, and checking a schema against the
    metaschema costs about 1 ms (ToolAPI-v0's 12 OpenAPI tools: 10 ms per env).
    """
    return checked_schema_of(json.loads(text), refs='"$ref"' in text)


def checked_schema_of(
    schema: dict[str, Any], refs: bool = True
) -> tuple[Any, Callable[[Any], bool] | None]:
    """A validator and a fast check for ``schema``.

    Raises ``SchemaError`` when it is not a schema, `UnresolvedRef` for a ``$ref`` in it that
    does not resolve (the metaschema check does not follow them: every call of the tool
    crashed the episode instead). ``refs=False`` says it holds no ``$ref``: nothing to follow.
    """
    jsonschema.Draft202012Validator.check_schema(schema)
    if refs:
        unresolved = _unresolved_ref(schema)
        if unresolved is not None:
            raise UnresolvedRef(*unresolved)
    return jsonschema.Draft202012Validator(schema), compile_fast_check(schema)


#: Keywords whose value maps names to schemas (a property may be named "default").
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def _unresolved_ref(schema: Any) -> tuple[str, str, str] | None:
    """The first ``$ref`` in ``schema`` that does not resolve: (where, the ref, why); or None.

    Resolved as the validator will (draft 2020-12, relative to the nearest ``$id``), with no
    remote documents: a remote ref cannot be fetched when the tool is called either.
    """
    spec = referencing.jsonschema.DRAFT202012
    root = referencing.Resource.from_contents(schema, default_specification=spec)
    registry: referencing.Registry[Any] = referencing.Registry().with_resource("", root)

    def walk(node: Any, resolver: Any, path: list[str]) -> tuple[str, str, str] | None:
        if isinstance(node, dict):
            if path and isinstance(node.get("$id"), str):
                sub = referencing.Resource.from_contents(node, default_specification=spec)
                resolver = resolver.in_subresource(sub)
            ref = node.get("$ref")
            if isinstance(ref, str):
                try:
                    resolver.lookup(ref)
                except referencing.exceptions.Unresolvable as exc:
                    why = str(exc).split(" within ", 1)[0]  # not the whole schema again
                    return "/".join(path), ref, f"{type(exc).__name__}: {why[:200]}"
            children: Any = node.items()
        elif isinstance(node, list):
            children = ((str(i), v) for i, v in enumerate(node))
        else:
            return None
        in_schema = isinstance(node, dict) and (not path or path[-1] not in _SCHEMA_MAPS)
        for key, value in children:
            if in_schema and key in ("const", "enum", "default", "examples"):
                continue  # values, not schemas: a "$ref" key there is data
            found = walk(value, resolver, [*path, str(key)])
            if found is not None:
                return found
        return None

    return walk(schema, registry.resolver(), [])


def whole_floats_as_ints(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` with each whole float where ``schema`` asks for an integer made an int.

    JSON Schema counts 5.0 as an integer, so it passes the check; a plain ``int`` parameter
    (given as decoded, no pydantic) then got a float, ``range(n)`` raised in the tool and the
    model was told the tool had failed. Only the slow path (the compiled check declines a
    float where an integer is due) pays for the walk.
    """
    if isinstance(value, float) and value.is_integer() and _asks_integer(schema):
        return int(value)
    if isinstance(value, dict):
        branch = _branch(schema, "object")
        properties, extra = branch.get("properties", {}), branch.get("additionalProperties")
        other = extra if isinstance(extra, dict) else {}  # a dict[str, int]'s values
        return {k: whole_floats_as_ints(v, properties.get(k, other)) for k, v in value.items()}
    if isinstance(value, list):
        items = _branch(schema, "array").get("items", {})
        return [whole_floats_as_ints(v, items) for v in value]
    return value


def _asks_integer(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return (kind == "integer" or (isinstance(kind, list) and "integer" in kind)
            or any(_asks_integer(s) for s in schema.get("anyOf", ())))  # fmt: skip


def _branch(schema: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """The part of ``schema`` for values of JSON type ``kind`` (its ``anyOf`` branch)."""
    for option in schema.get("anyOf", ()):
        if option.get("type") == kind:
            return option
    return schema


def not_unicode(value: Any) -> str | None:
    r"""Where in ``value`` (parsed JSON) a string holds a lone surrogate; None if nowhere.

    Why: JSON may spell one (``"\ud800"``), and a tool that sends its arguments on (to a
    sandbox, an MCP server, a web API) fails to encode it as UTF-8 there, which looks like the
    service failing (`InfraError`: the episode dropped, not scored). A model could pick how its
    outcome counts; here it is the model's mistake, before any tool runs. Every call of every
    tool pays for this check, so a path (``arguments/a/1``) is built only once one is found.
    """
    found = _surrogate_at(value)
    return None if found is None else "arguments" + found


#: JSON values that hold no text: `_surrogate_at` passes them without a further test.
_NO_TEXT: frozenset[type] = frozenset({int, float, bool, type(None)})


def _surrogate_at(value: Any) -> str | None:
    """The path below ``value`` to a string holding a lone surrogate ("" for ``value``)."""
    if isinstance(value, str):
        return None if _is_text(value) else ""
    items: Any = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ()
    )  # fmt: skip
    for key, item in items:
        if not (type(key) is str and key.isascii()) and not _is_text(key):
            return " (a name)"
        kind = type(item)
        if kind in _NO_TEXT or (kind is str and item.isascii()):  # the usual argument
            continue
        found = _surrogate_at(item)  # a str, dict or list; None for anything else
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


def describe_error(argument: str, error: Any) -> str:
    """One pydantic error as ``path/to/field: message (got value)``."""
    path = "/".join(map(str, (argument, *error["loc"])))
    got = error.get("input")
    shown = f" (got {got!r})" if isinstance(got, (str, int, float)) and len(repr(got)) < 80 else ""
    return f"{path}: {error['msg']}{shown}"


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
