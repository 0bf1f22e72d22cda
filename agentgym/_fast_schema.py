"""A fast "valid" for the simple JSON schemas of tools; jsonschema still says every "invalid".

Validating a call's arguments with jsonschema costs more than the rest of an env step. Tool
schemas built from type hints use a few keywords (``type``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``enum``, ``anyOf``) that plain Python tests decide exactly
for values decoded from JSON. `compile_fast_check` turns such a schema into a predicate that
answers True only for values jsonschema (Draft 2020-12) accepts. Everything else goes to
jsonschema, which gives the verdict and the messages: a False from the predicate, a schema
with any other keyword (no predicate at all), a float where an integer is due, a type that
JSON does not produce (a dict subclass, a tuple). So the fast path changes how long validation
takes, never its outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: A predicate: True means "jsonschema accepts this value"; False means "ask jsonschema".
Check = Callable[[Any], bool]

_JSON_TYPES: frozenset[type] = frozenset({str, int, float, bool, type(None), dict, list})
_TYPES: dict[str, frozenset[type]] = {
    "string": frozenset({str}),
    "integer": frozenset({int}),  # 2.0 is an integer too: jsonschema decides that one
    "number": frozenset({int, float}),
    "boolean": frozenset({bool}),
    "null": frozenset({type(None)}),
    "object": frozenset({dict}),
    "array": frozenset({list}),
}
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment"})
_KEYWORDS = frozenset(
    {"type", "enum", "anyOf", "items", "properties", "required", "additionalProperties"}
)


def compile_fast_check(schema: Any) -> Check | None:
    """A predicate for ``schema``, or None when it uses keywords this module does not decide."""
    if not isinstance(schema, dict) or not schema.keys() - _ANNOTATIONS <= _KEYWORDS:
        return None
    allowed = _allowed_types(schema.get("type"))
    enum = schema.get("enum")
    if allowed is None or (enum is not None and not _plain_enum(enum)):
        return None
    strings = None if enum is None else frozenset(o for o in enum if o is not None)
    none_ok = enum is not None and None in enum
    any_of = [compile_fast_check(s) for s in schema.get("anyOf", ())]
    items = compile_fast_check(schema["items"]) if "items" in schema else _accept
    properties = {k: compile_fast_check(s) for k, s in schema.get("properties", {}).items()}
    extra = schema.get("additionalProperties", True)
    if isinstance(extra, bool):
        extra_rule: Check | None = _accept if extra else _refer
    else:
        extra_rule = compile_fast_check(extra)
    if None in any_of or None in properties.values() or items is None or extra_rule is None:
        return None
    any_of_rules = [c for c in any_of if c is not None]
    property_rules = {k: c for k, c in properties.items() if c is not None}
    item_rule, other_rule = items, extra_rule
    required = frozenset(schema.get("required", ()))
    object_rules = bool(property_rules or required or other_rule is not _accept)
    if strings is None and not any_of_rules and not object_rules and item_rule is _accept:
        return _type_check(allowed)

    def check(value: Any) -> bool:
        kind = type(value)
        if kind not in allowed:
            return False
        if strings is not None and not (
            (kind is str and value in strings) or (value is None and none_ok)
        ):
            return False
        if any_of_rules and not any(rule(value) for rule in any_of_rules):
            return False
        if kind is dict and object_rules:
            if not value.keys() >= required:
                return False
            for key, item in value.items():
                if not property_rules.get(key, other_rule)(item):
                    return False
        elif kind is list and item_rule is not _accept:
            return all(map(item_rule, value))
        return True

    return check


def _type_check(allowed: frozenset[type]) -> Check:
    """The check of a schema of a type alone (most parameters'): the value's type decides.

    What `compile_fast_check`'s general check answers for such a schema, with none of its
    other tests run on every argument of every call.
    """

    def check_type(value: Any) -> bool:
        return type(value) in allowed

    return check_type


def _accept(value: Any) -> bool:
    """The rule of a keyword that allows anything (or is absent)."""
    return True


def _refer(value: Any) -> bool:
    """The rule of ``additionalProperties: false``: an extra property goes to jsonschema."""
    return False


def _allowed_types(spec: Any) -> frozenset[type] | None:
    """The Python types a ``type`` keyword lets through (all JSON types when absent)."""
    if spec is None:
        return _JSON_TYPES
    names = [spec] if isinstance(spec, str) else spec
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _TYPES for n in names):
        return None
    allowed: set[type] = set()
    for name in names:
        allowed |= _TYPES[name]
    return frozenset(allowed)


def _plain_enum(options: Any) -> bool:
    """An enum of strings and null; numbers and booleans go to jsonschema (``1`` vs ``True``)."""
    return isinstance(options, list) and all(type(o) is str or o is None for o in options)
