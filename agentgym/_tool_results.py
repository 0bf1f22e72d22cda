"""A tool's return value as the text of a ``tool`` message (`format_result`)."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from typing import Any

import pydantic

from ._errors import ToolError
from ._json import is_array

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
    their JSON data, not their repr, numpy and torch numbers and arrays as numbers and lists
    (not ``"3"`` and ``"[1 2]"``), and floats JSON has no number for (NaN, Infinity,
    -Infinity) as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, so the text stays
    valid JSON without losing what the value was; an enum member is its value and a
    dataclass an object of its fields, as in the tool's schema. Values JSON cannot carry fall
    back to their str (a date, a set), except those whose str shows a memory address
    (an object without a ``__repr__``, a function): it differs in every run, so an episode
    could not be replayed, and it tells the model nothing. Such a result raises `ToolError`
    naming its type, for the model to read and the tool's author to fix (``tool_name``
    names the tool in the message).
    """
    try:
        text = _result_text(value, tool_name)
    except ValueError as exc:  # an int past Python's 4,300 digits (the model's arguments did it)
        raise ToolError(
            f"{'the tool' if tool_name is None else repr(tool_name)} returned a value too large "
            f"to write as text ({exc}); the tool must return a str or JSON data it can print"
        ) from None
    return text if text.isascii() else _utf8(text)


def _utf8(text: str) -> str:
    """``text`` with its lone surrogates written as backslash escapes: it goes out as UTF-8.

    Why: a file name decoded with ``os.fsdecode`` holds them; the episode ended ``ok`` and
    writing it to JSONL then killed the eval (and a training run) with `UnicodeEncodeError`.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _result_text(value: Any, tool_name: str | None) -> str:
    """`format_result` before its text is made safe to encode."""
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
    if is_array(value):
        return value.tolist()  # numbers, not their str in quotes ("3", "[1 2]")
    if isinstance(value, enum.Enum):  # the value the tool's schema and the model use, not
        return value.value  # "Unit.C"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}  # as JSON
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
