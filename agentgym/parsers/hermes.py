r"""Hermes format (Qwen2.5, Qwen3, Hermes).

Each call is ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``. `render` writes a
``</`` inside a JSON string as ``<\/`` (JSON's escaped slash), so an argument holding
``</tool_call>`` cannot close the block early.
"""

from __future__ import annotations

import json
import re

from ._base import (
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    call_from_json,
    refuse_call_start,
    register_parser,
)

_CALL_START = re.compile("<tool_call>")
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


@register_parser("hermes")
class HermesParser(ToolCallParser):
    """Content is everything before the first ``<tool_call>``; an unclosed last block counts."""

    def parse(self, text: str) -> ParsedTurn:
        found = _CALL_START.search(text)
        if not found:
            return ParsedTurn(content=text)
        turn = ParsedTurn(content=text[: found.start()].strip())
        for raw in _BLOCK.findall(text, found.start()):
            try:
                turn.tool_calls.append(call_from_json(json.loads(raw.strip())))
            except (ValueError, TypeError) as exc:
                turn.errors.append(f"malformed <tool_call> {raw.strip()[:200]!r}: {exc}")
        return turn

    def render(self, content: str, tool_calls: list[ToolCall]) -> str:
        refuse_call_start(self.name, content, _CALL_START)
        blocks = [f"<tool_call>\n{_call_json(c)}\n</tool_call>" for c in tool_calls]
        return "\n".join(([content] if content else []) + blocks)


def _call_json(call: ToolCall) -> str:
    r"""The call as JSON with every ``</`` escaped to ``<\/``.

    A ``<`` can only sit inside a JSON string, where ``<\/`` reads back as ``</``, so no
    argument can close the block early.
    """
    text = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return text.replace("</", "<\\/")
