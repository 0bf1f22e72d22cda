"""Llama 3.x JSON tool calls: ``<|python_tag|>{"name": ..., "parameters": {...}}``.

The model answers with one JSON object per call, optionally after the ``<|python_tag|>`` token;
several calls are separated by ``;``. ``"arguments"`` is accepted in place of ``"parameters"``
(Llama 4 and some fine-tunes write it). Text before the first call is the content.
"""

from __future__ import annotations

import json
import re

from ._base import (
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    call_from_json,
    json_raw_decode,
    refuse_call_start,
    register_parser,
)

PYTHON_TAG = "<|python_tag|>"
# Where a call may start: the python tag, or a '{"name"' (or '"parameters"') object opening the
# text or a line. A brace in mid-sentence ("use {x}") or other JSON stays content.
_CALL_START = re.compile(r'(?:^|\n)[ \t]*(?=\{\s*"(?:name|parameters|arguments)"\s*:)')
_ANY_START = re.compile(f"{re.escape(PYTHON_TAG)}|{_CALL_START.pattern}")


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
        tag = text.find(PYTHON_TAG)
        match = _CALL_START.search(text)
        starts = [i for i in (tag, match.start() if match else -1) if i >= 0]
        if not starts:
            return ParsedTurn(content=text)
        start = min(starts)
        turn = ParsedTurn(content=text[:start].strip())
        rest, pos = text[start:], 0
        while True:
            pos = _skip_separators(rest, pos)
            if pos >= len(rest):
                break
            if rest[pos] != "{":
                turn.errors.append(f"unexpected text after the tool calls: {rest[pos:][:200]!r}")
                break
            try:
                obj, end = json_raw_decode(rest, pos)
            except ValueError as exc:  # JSONDecodeError, an int too long, nesting too deep
                turn.errors.append(f"malformed tool call {rest[pos:][:200]!r}: {exc}")
                break
            try:
                turn.tool_calls.append(call_from_json(obj, ("parameters", "arguments")))
            except (ValueError, TypeError) as exc:
                turn.errors.append(f"malformed tool call {rest[pos:end][:200]!r}: {exc}")
            pos = end
        return turn

    def render(self, content: str, tool_calls: list[ToolCall]) -> str:
        refuse_call_start(self.name, content, _ANY_START)
        calls = "; ".join(
            json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False)
            for c in tool_calls
        )
        if not calls:
            return content
        prefix = PYTHON_TAG if self.python_tag else ""
        return f"{content}\n{prefix}{calls}" if content else prefix + calls
