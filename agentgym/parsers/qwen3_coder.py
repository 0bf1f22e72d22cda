r"""Qwen3-Coder XML tool calls (Qwen3-Coder, Qwen3.5): one ``<tool_call>`` block per call.

A turn with content and one call, as the chat template renders it::

    Let me check.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Values carry no types: the template writes a string as it is, a list or dict as JSON, and
other values with Python's ``str`` (``True``, ``None``, ``3``). So `parse` reads a value as
JSON (or ``True``/``False``/``None``) and keeps it as text when that fails, except for
parameters whose tool schema allows a string (``"type": "string"``, a type list holding it,
or an ``anyOf``/``oneOf`` branch, as ``str | None`` gives), which stay text (`for_tools` gives
the parser the env's schemas; without them ``"42"`` reads as the number 42, as in vLLM). A
string that would read back as something else (``"42"`` without a schema, text holding
``</parameter>``) is written as a JSON string literal with ``</`` escaped as ``<\/``, so
`render` round-trips every value. Parameter values end at the first ``</parameter>``; one
newline after the opening tag and one before the closing tag belong to the markup.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ._base import (
    ForwardFinder,
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    json_loads,
    refuse_call_start,
    register_parser,
    skip_space,
)

_CALL_START = re.compile(r"<tool_call>|<function=")
_TOOL_CALL, _TOOL_CALL_END = "<tool_call>", "</tool_call>"
_FUNCTION, _FUNCTION_END = "<function=", "</function>"
_PARAMETER, _PARAMETER_END = "<parameter=", "</parameter>"
_PYTHON_WORDS = {"True": True, "False": False, "None": None}
#: Characters a function or parameter name cannot hold: they would end the tag early.
_BAD_NAME = re.compile(r"[<>\n]")


@register_parser("qwen3_coder")
class Qwen3CoderParser(ToolCallParser):
    """Parse and render Qwen3-Coder's XML tool calls.

    Args:
        tools: OpenAI tool schemas; parameters whose schema allows a string there are never
            decoded as JSON. The env passes its own through `for_tools`.
    """

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self._string_params: dict[str, set[str]] = {}
        for schema in tools or ():
            function = schema.get("function", schema)
            properties = (function.get("parameters") or {}).get("properties") or {}
            self._string_params[function.get("name", "")] = {
                key for key, spec in properties.items() if _allows_string(spec)
            }

    def for_tools(self, tools: list[dict[str, Any]]) -> Qwen3CoderParser:
        return Qwen3CoderParser(tools)

    def parse(self, text: str) -> ParsedTurn:
        found = _CALL_START.search(text)
        if not found:
            return ParsedTurn(content=text)
        turn = ParsedTurn(content=text[: found.start()].strip())
        pos, param_ends = found.start(), ForwardFinder(text, _PARAMETER_END)
        while (found := _CALL_START.search(text, pos)) is not None:
            pos = self._read_call(text, found.start(), turn, param_ends)
        return turn

    def _read_call(self, text: str, start: int, turn: ParsedTurn, param_ends: ForwardFinder) -> int:
        """Read the call at ``start`` into ``turn``; return where the next one may start."""
        pos = start + len(_TOOL_CALL) if text.startswith(_TOOL_CALL, start) else start
        pos = skip_space(text, pos)
        name_end = text.find(">", pos)
        name = text[pos + len(_FUNCTION) : max(name_end, pos)]
        if not text.startswith(_FUNCTION, pos) or name_end < 0 or not name or "\n" in name:
            snippet = text[start : start + 200]
            turn.errors.append(f"malformed <tool_call> {snippet!r}: expected <function=NAME>")
            return _after_block(text, pos)
        arguments: dict[str, Any] = {}
        pos = name_end + 1
        while True:
            pos = skip_space(text, pos)
            if text.startswith(_FUNCTION_END, pos):
                pos = skip_space(text, pos + len(_FUNCTION_END))
                turn.tool_calls.append(ToolCall(name=name, arguments=arguments))
                return pos + len(_TOOL_CALL_END) if text.startswith(_TOOL_CALL_END, pos) else pos
            opened = text.startswith(_PARAMETER, pos)
            key_end = text.find(">", pos) if opened else -1
            value_end = param_ends.find(key_end + 1) if key_end >= 0 else -1
            if value_end < 0:
                problem = "cut off at" if opened or pos >= len(text) else "unexpected text"
                turn.errors.append(
                    f"malformed <function={name}>: {problem} {text[pos : pos + 200]!r} "
                    "(expected <parameter=NAME>...</parameter> or </function>)"
                )
                return _after_block(text, pos)
            key = text[pos + len(_PARAMETER) : key_end]
            arguments[key] = self._decode(name, key, _unwrap(text[key_end + 1 : value_end]))
            pos = value_end + len(_PARAMETER_END)

    def render(self, content: str, tool_calls: list[ToolCall]) -> str:
        refuse_call_start(self.name, content, _CALL_START)
        blocks = []
        for call in tool_calls:
            _check_name(call.name, "tool name")
            parameters = "".join(
                f"{_PARAMETER}{_check_name(key, f'parameter of {call.name!r}')}>\n"
                f"{self._encode(call.name, key, value)}\n{_PARAMETER_END}\n"
                for key, value in call.arguments.items()
            )
            blocks.append(
                f"{_TOOL_CALL}\n{_FUNCTION}{call.name}>\n{parameters}{_FUNCTION_END}\n{_TOOL_CALL_END}"
            )
        calls = "\n".join(blocks)
        if not calls:
            return content
        return f"{content}\n\n{calls}" if content else calls

    # ---- values --------------------------------------------------------------------------
    def _decode(self, function: str, key: str, raw: str) -> Any:
        """A parameter's value from its text (see the module docstring for the rules)."""
        is_string = key in self._string_params.get(function, ())
        try:
            value = json_loads(raw)
        except ValueError:  # not JSON, or nested deeper than MAX_DEPTH: text
            return raw if is_string else _PYTHON_WORDS.get(raw, raw)
        return raw if is_string and not isinstance(value, str) else value

    def _encode(self, function: str, key: str, value: Any) -> str:
        """A parameter's text that `_decode` reads back as ``value``; ValueError if none."""
        if isinstance(value, str):
            plain = _PARAMETER_END not in value and self._decode(function, key, value) == value
            text = value if plain else _escaped_json(value)
        elif value is None or isinstance(value, bool):
            text = str(value)  # what the template's `| string` writes
        else:
            text = _escaped_json(value)
        decoded = self._decode(function, key, text)
        if decoded != value or type(decoded) is not type(value):
            raise ValueError(
                f"qwen3_coder cannot render {key}={value!r} of {function!r}: it would read back "
                f"as {decoded!r} (the tool schema types {key!r} as a string)"
            )
        return text


def _allows_string(spec: Any, depth: int = 0) -> bool:
    """Whether a parameter's schema accepts a string.

    That is ``"type": "string"``, a type list holding it (``["string", "null"]``), or an
    ``anyOf``/``oneOf`` branch that does (``str | None``). Why: only ``"type": "string"``
    counted, so ``12345`` for an optional string parameter read as an int and the model's
    valid call was refused as invalid (vLLM keeps it a string).
    """
    if not isinstance(spec, dict) or depth > 8:
        return False
    kind = spec.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True
    return any(
        _allows_string(branch, depth + 1)
        for key in ("anyOf", "oneOf")
        if isinstance(spec.get(key), list)
        for branch in spec[key]
    )


def _after_block(text: str, pos: int) -> int:
    """Where reading resumes after a malformed call: past its ``</tool_call>``, else the end."""
    end = text.find(_TOOL_CALL_END, pos)
    return len(text) if end < 0 else end + len(_TOOL_CALL_END)


def _unwrap(value: str) -> str:
    """Drop the newline after the opening tag and the one before the closing tag."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _escaped_json(value: Any) -> str:
    r"""JSON text without ``</`` (written ``<\/``, which JSON reads back as ``</``)."""
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")


def _check_name(name: str, what: str) -> str:
    if not name or _BAD_NAME.search(name):
        raise ValueError(f"qwen3_coder cannot render {what} {name!r}: no '<', '>' or newlines")
    return name
