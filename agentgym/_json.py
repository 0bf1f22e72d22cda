"""`loads`: `json.loads` for the hot path of every step, with `json.loads`'s results and errors.

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


def loads(text: str) -> Any:
    """The JSON value in ``text``; raises what `json.loads` raises (`json.JSONDecodeError` ...)."""
    try:
        value, end = _scan(text, 0)
    except Exception:  # StopIteration for no value at 0; a JSONDecodeError further on
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value
