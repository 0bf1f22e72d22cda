"""JSON helpers: `loads` and `dumps` for the hot path of every step, `is_array` for numbers.

`is_array` says what JSON should write as numbers and lists (numpy and torch scalars and
arrays) where it would fall back to text.

`json.loads` spends more time in its Python wrapper (two whitespace regexes, a BOM check,
three calls) than its C scanner spends reading a tool call. `loads` runs the scanner directly
on text that is exactly one JSON value, and hands anything else (surrounding whitespace,
invalid text, trailing data) to `json.loads`, so the value or the error message is the one
`json.loads` gives.

`json.dumps(value, ensure_ascii=False)` builds a `json.JSONEncoder` and then its C encoder on
every call, which costs twice what writing a tool call's arguments does. `dumps` makes only
the C encoder, with the same settings (circular references still checked), so its text and
its errors are `json.dumps`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import encoder as _encoder
from typing import Any

_DECODER: Any = json.JSONDecoder()  # json.loads's own settings: no hooks, strict
_scan: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once
#: ``json.dumps(..., ensure_ascii=False)``'s encoder, whose ``default`` raises its TypeError.
_ENCODER = json.JSONEncoder(ensure_ascii=False)
#: json's C encoder factory (None on a Python built without it).
_make_encoder: Any = getattr(_encoder, "c_make_encoder", None)


#: Libraries whose scalars and arrays become Python numbers and lists (``tolist``).
_ARRAY_LIBRARIES = frozenset({"numpy", "torch"})


def is_array(value: Any) -> bool:
    """A numpy/torch scalar or array: JSON writes its ``tolist()``, numbers, not their text."""
    return type(value).__module__.partition(".")[0] in _ARRAY_LIBRARIES and hasattr(
        value, "tolist"
    )


def loads(text: str) -> Any:
    """The JSON value in ``text``; raises what `json.loads` raises (`json.JSONDecodeError` ...)."""
    try:
        value, end = _scan(text, 0)
    except Exception:  # StopIteration for no value at 0; a JSONDecodeError further on
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


def dumps(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)``: the same text, or the same error, sooner."""
    if _make_encoder is None:  # a Python without json's C accelerator
        return _ENCODER.encode(value)
    # json.JSONEncoder.iterencode's own call, with json.dumps's settings (markers: {})
    write = _make_encoder({}, _ENCODER.default, _encoder.encode_basestring, None, ": ", ", ",
                          False, False, True)  # fmt: skip
    return "".join(write(value, 0))
