r"""Mistral tool calls, both generations of the format, after the ``[TOOL_CALLS]`` token.

- ``"json"`` style (tokenizers before v11, e.g. Mistral-7B-Instruct-v0.3):
  ``content[TOOL_CALLS] [{"name": "f", "arguments": {...}, "id": "aB3dE6gH9"}, ...]`` (a bare
  object is one call). The model writes each call's id (9 letters and digits, as
  ``mistral_common`` trained it) and the template requires that shape on every call and tool
  result, so `parse` keeps an id of that shape, `render` always writes one, and `make_call_id`
  gives the env ids of that shape for calls that came without.
- ``"args"`` style (v11+ tokenizers, e.g. Mistral Small 3.2, Magistral):
  ``content[TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}``; ``f{...}`` without ``[ARGS]``
  is accepted too.

`parse` reads both styles; `render` writes the one chosen at construction, with every
``[TOOL_CALLS]`` inside a JSON string written as ``\u005bTOOL_CALLS]`` so that no argument
splits the calls.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from typing import Literal

from .._errors import ConfigError
from ._base import (
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    call_from_json,
    json_raw_decode,
    marker_without_call,
    refuse_call_start,
    register_parser,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME = re.compile(r"\s*([^\s\[\]{}]+)\s*(?:\[ARGS\])?\s*", re.ASCII)
#: What the "args" style can carry: no Unicode whitespace either, which `parse`'s strip drops.
_BARE_NAME = re.compile(r"[^\s\[\]{}]+")
_CALL_START = re.compile(re.escape(TOOL_CALLS))
_CALL_ID = re.compile(r"[A-Za-z0-9]{9}")
_ID_ALPHABET = string.ascii_letters + string.digits


def call_id(seed: str) -> str:
    """A 9-character alphanumeric id (the shape Mistral templates require), fixed by ``seed``."""
    number = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big")
    chars = []
    for _ in range(9):
        number, digit = divmod(number, len(_ID_ALPHABET))
        chars.append(_ID_ALPHABET[digit])
    return "".join(chars)


def _parse_json_style(segment: str, turn: ParsedTurn) -> None:
    """``[{"name": ..., "arguments": ...}, ...]`` or one bare object; trailing text is ignored."""
    try:
        value, _ = json_raw_decode(segment)
    except ValueError as exc:  # JSONDecodeError, an int too long, nesting too deep
        turn.errors.append(f"malformed {TOOL_CALLS} {segment[:200]!r}: {exc}")
        return
    for obj in value if isinstance(value, list) else [value]:
        try:
            call = call_from_json(obj)
        except (ValueError, TypeError) as exc:
            turn.errors.append(f"malformed tool call {json.dumps(obj)[:200]!r}: {exc}")
            continue
        written = obj.get("id")
        # another shape would make the template refuse the conversation: the env assigns one
        call.id = written if isinstance(written, str) and _CALL_ID.fullmatch(written) else ""
        turn.tool_calls.append(call)


def _parse_args_style(segment: str, turn: ParsedTurn) -> None:
    """``name[ARGS]{...}`` (or ``name{...}``); text after the JSON object is ignored."""
    match = _NAME.match(segment)
    if not match or not segment[match.end() :].startswith("{"):
        turn.errors.append(f"malformed {TOOL_CALLS} {segment[:200]!r}: expected name[ARGS]{{...}}")
        return
    try:
        arguments, _ = json_raw_decode(segment, match.end())
    except ValueError as exc:
        turn.errors.append(f"malformed arguments of {match.group(1)!r}: {exc}")
        return
    turn.tool_calls.append(ToolCall(name=match.group(1), arguments=arguments))


@register_parser("mistral")
class MistralParser(ToolCallParser):
    """Parse and render Mistral ``[TOOL_CALLS]`` tool calls.

    Args:
        style: what `render` writes: ``"json"`` (a JSON array of calls, pre-v11 tokenizers) or
            ``"args"`` (``name[ARGS]{...}`` per call, v11+ tokenizers). Parsing accepts both.
    """

    def __init__(self, style: Literal["json", "args"] = "json") -> None:
        if style not in ("json", "args"):
            raise ConfigError(f"mistral parser style must be 'json' or 'args', got {style!r}")
        self.style = style

    def parse(self, text: str) -> ParsedTurn:
        start = text.find(TOOL_CALLS)
        if start < 0:
            return ParsedTurn(content=text)
        turn = ParsedTurn(content=text[:start].strip())
        for segment in text[start + len(TOOL_CALLS) :].split(TOOL_CALLS):
            segment = segment.strip()
            if not segment:
                continue
            if segment[0] in "[{":
                _parse_json_style(segment, turn)
            else:
                _parse_args_style(segment, turn)
        return marker_without_call(turn, TOOL_CALLS)

    def render(self, content: str, tool_calls: list[ToolCall]) -> str:
        refuse_call_start(self.name, content, _CALL_START)
        if not tool_calls:
            return content
        if self.style == "json":
            calls = [
                {"name": c.name, "arguments": c.arguments, "id": c.id or _derived_id(content, i, c)}
                for i, c in enumerate(tool_calls)
            ]
            return f"{content}{TOOL_CALLS} {_json(calls)}"
        for call in tool_calls:
            if not _BARE_NAME.fullmatch(call.name):
                raise ValueError(
                    f"mistral style 'args' cannot render tool name {call.name!r}: "
                    "no whitespace, brackets or braces"
                )
        return content + "".join(
            f"{TOOL_CALLS}{c.name}{ARGS}{_json(c.arguments)}" for c in tool_calls
        )

    def make_call_id(self, turn: int, index: int) -> str:
        """9 letters and digits: Mistral templates refuse any other id (``call_1_0`` included)."""
        return call_id(f"agentgym-call-{turn}-{index}")


def _derived_id(content: str, index: int, call: ToolCall) -> str:
    """The id `render` writes for a call without one: fixed by the turn, so renders repeat."""
    return call_id(json.dumps([content, index, call.name, call.arguments], sort_keys=True))


def _json(value: object) -> str:
    r"""JSON text in which ``[TOOL_CALLS]`` can only appear escaped.

    Letters never follow ``[`` outside a JSON string, so every match is inside one, where
    ``\u005b`` reads back as ``[``.
    """
    text = json.dumps(value, ensure_ascii=False)
    return text.replace(TOOL_CALLS, "\\u005b" + TOOL_CALLS[1:])
