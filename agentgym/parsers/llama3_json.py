"""Llama 3.x JSON tool calls: ``<|python_tag|>{"name": ..., "parameters": {...}}``.

The model answers with one JSON object per call, optionally after the ``<|python_tag|>`` token;
several calls are separated by ``;``, or written as one JSON list of calls (as vLLM reads
them). ``"arguments"`` is accepted in place of ``"parameters"`` (Llama 4 and some fine-tunes
write it), and other keys (``"type": "function"``) are ignored. Text before the first call is
the content.
"""

from __future__ import annotations

import json
import re

from ._base import (
    ARGUMENT_KEYS,
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    call_from_json,
    json_raw_decode,
    marker_without_call,
    register_parser,
)

PYTHON_TAG = "<|python_tag|>"
# Where a call may start: the python tag, or a '{"name"' (or '"parameters"') object, or a list
# opening with one, opening the text or a line. A brace in mid-sentence ("use {x}") stays
# content; other JSON at a line start is a call only if it decodes to one (`_json_start`).
_CALL_START = re.compile(
    r'(?:^|\n)[ \t]*(?=(?:\[[ \t]*)?\{\s*"(?:name|parameters|arguments)"\s*:)'
)
#: JSON opening the text or a line: a call if it decodes to one (``{"type": "function", ...}``).
_JSON_START = re.compile(r'(?:^|\n)[ \t]*(?=\{\s*"|\[\s*\{\s*")')
#: Line-start JSON values `_json_start` decodes at most: past them, only `_CALL_START` counts.
_MAX_JSON_TRIES = 256
#: The slices `_decode_at` decodes a value from, in turn, after its own line.
_WINDOWS = (256, 4096, 65536)


def _is_call(value: object) -> bool:
    """Whether decoded JSON is a call as vLLM reads one: a ``name`` and arguments key."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("name"), str)
        and any(k in value for k in ARGUMENT_KEYS)
    )


def _json_start(text: str, before: int) -> int:
    """Where the first line-start JSON before ``before`` that decodes to calls starts, or -1.

    Calls: a call as vLLM reads one, or a list of them. A value that decodes to something
    else is skipped whole, and one that does not decode is skipped to where it failed, so
    each stretch of text is decoded about once.
    """
    pos = 0
    for _ in range(_MAX_JSON_TRIES):
        found = _JSON_START.search(text, pos, before)
        if found is None:
            break
        start = found.end()
        value, end = _decode_at(text, start, before)
        if end < 0:
            return -1  # nested too deep: no call, and each later line would nest as deep
        items = value if isinstance(value, list) else [value]
        if items and all(map(_is_call, items)):
            return start
        pos = max(end, start + 1)
    return -1


def _decode_at(text: str, start: int, before: int) -> tuple[object, int]:
    """The JSON value at ``start`` and its end, or (None, where it failed); end -1: too deep.

    Decoded from slices starting at ``start``, its line first, then growing ones cut at line
    ends (``before`` at most): a failed decode's error counts the lines before it, which on
    the whole text made 33k short lines of bad JSON take seconds. A JSON token never spans a
    line break, so a failure inside a slice is a failure of the whole value; one at the
    slice's end may go on past it.
    """
    stops = [text.find("\n", start + size, before) for size in (0, *_WINDOWS)]
    for stop in sorted({*(i for i in stops if i >= 0), before}):  # each cut at a line end
        window = text[start:stop]
        try:
            value, end = json_raw_decode(window)
        except json.JSONDecodeError as exc:
            if exc.pos < len(window) or stop == before:
                return None, start + exc.pos
            continue
        except ValueError:
            return None, -1
        return value, start + end
    return None, before  # not reached: the last window is cut at ``before``


def _find_start(text: str) -> int:
    """Where the calls start in ``text`` (see `_CALL_START`), or -1."""
    tag = text.find(PYTHON_TAG)
    match = _CALL_START.search(text)
    starts = [i for i in (tag, match.start() if match else -1) if i >= 0]
    first = min(starts) if starts else len(text)
    loose = _json_start(text, first)
    return loose if loose >= 0 else (first if starts else -1)


def _skip_separators(text: str, pos: int) -> int:
    """Index of the first character at or after ``pos`` that is not a separator or the tag."""
    while pos < len(text):
        if text.startswith(PYTHON_TAG, pos):
            pos += len(PYTHON_TAG)
        elif text[pos] in " \t\r\n;":
            pos += 1
        else:
            break
    return pos


@register_parser("llama3_json")
class Llama3JsonParser(ToolCallParser):
    """Parse and render Llama 3.x JSON tool calls.

    Args:
        python_tag: whether `render` puts ``<|python_tag|>`` before the calls (Llama 3.1's
            built-in-tool style); parsing accepts both.
    """

    def __init__(self, python_tag: bool = False) -> None:
        self.python_tag = python_tag

    def parse(self, text: str) -> ParsedTurn:
        start = _find_start(text)
        if start < 0:
            return ParsedTurn(content=text)
        turn = ParsedTurn(content=text[:start].strip())
        rest, pos = text[start:], 0
        while True:
            pos = _skip_separators(rest, pos)
            if pos >= len(rest):
                break
            if rest[pos] not in "{[":
                turn.errors.append(f"unexpected text after the tool calls: {rest[pos:][:200]!r}")
                break
            try:
                value, end = json_raw_decode(rest, pos)
            except ValueError as exc:  # JSONDecodeError, an int too long, nesting too deep
                turn.errors.append(f"malformed tool call {rest[pos:][:200]!r}: {exc}")
                break
            for obj in value if isinstance(value, list) and value else [value]:
                try:
                    turn.tool_calls.append(call_from_json(obj, ARGUMENT_KEYS))
                except (ValueError, TypeError) as exc:
                    turn.errors.append(f"malformed tool call {rest[pos:end][:200]!r}: {exc}")
            pos = end
        return marker_without_call(turn, PYTHON_TAG)

    def render(self, content: str, tool_calls: list[ToolCall]) -> str:
        start = _find_start(content)
        if start >= 0:
            raise ValueError(
                f"{self.name} cannot render content containing {content[start:][:40]!r}: "
                "it would parse as a tool call"
            )
        calls = "; ".join(
            json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False)
            for c in tool_calls
        )
        if not calls:
            return content
        prefix = PYTHON_TAG if self.python_tag else ""
        return f"{content}\n{prefix}{calls}" if content else prefix + calls
