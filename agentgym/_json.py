"""JSON helpers: `loads` for the hot path of every step, `is_array` for numpy/torch numbers.

`is_array` says what JSON should write as numbers and lists (numpy and torch scalars and
arrays) where it would fall back to text.

`json.loads` spends more time in its Python wrapper (two whitespace regexes, a BOM check,
three calls) than its C scanner spends reading a tool call. `loads` runs the scanner directly
on text that is exactly one JSON value, and hands anything else (surrounding whitespace,
invalid text, trailing data) to `json.loads`, so the value or the error message is the one
`json.loads` gives.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_DECODER: Any = json.JSONDecoder()  # json.loads's own settings: no hooks, strict
_scan: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once


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
