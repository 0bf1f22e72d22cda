"""Hermes format (Qwen2.5, Qwen3, Hermes).

Each call is ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``.
"""

from __future__ import annotations

import json
import re

from ._base import ParsedTurn, ToolCall, ToolCallParser, call_from_json, register_parser

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


@register_parser("hermes")
class HermesParser(ToolCallParser):
    """Content is everything before the first ``<tool_call>``; an unclosed last block counts."""

    def parse(self, text: str) -> ParsedTurn:
        start = text.find("<tool_call>")
        if start < 0:
            return ParsedTurn(content=text)
        turn = ParsedTurn(content=text[:start].strip())
        for raw in _BLOCK.findall(text[start:]):
            try:
                turn.tool_calls.append(call_from_json(json.loads(raw.strip())))
            except (ValueError, TypeError) as exc:
                turn.errors.append(f"malformed <tool_call> {raw.strip()[:200]!r}: {exc}")
        return turn

    def render(self, content: str, tool_calls: list[ToolCall]) -> str:
        blocks = [
            "<tool_call>\n"
            + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
            + "\n</tool_call>"
            for c in tool_calls
        ]
        return "\n".join(([content] if content else []) + blocks)
