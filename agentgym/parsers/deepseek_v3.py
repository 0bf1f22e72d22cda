r"""DeepSeek V3 tool calls, between DeepSeek's special tool-call tokens.

A turn with content and two calls, as DeepSeek-V3's chat template renders it (one line
break between calls; ``<｜...｜>`` are single tokens)::

    Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
    ```json
    {"a": 1}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>g
    ```json
    {}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

DeepSeek V3.1's template writes a shorter form, the calls back to back (one line here)::

    Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": 1}
    <｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Both parsers read both forms; ``deepseek_v3`` writes V3's and ``deepseek_v31`` V3.1's, so
that what the env renders (reference turns, SFT traces) is what the model's template writes.
Arguments are decoded as JSON objects, so a marker inside an argument string cannot end a
call early.
"""

from __future__ import annotations

import json
import re

from ._base import (
    ForwardFinder,
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    call_from_json,
    json_raw_decode,
    marker_without_call,
    refuse_call_start,
    register_parser,
    skip_space,
)

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
_CALL_START = re.compile(f"{re.escape(CALLS_BEGIN)}|{re.escape(CALL_BEGIN)}")
#: The V3 header after the separator is the name on its own line, then this json code fence.
_V3_FENCE = re.compile(r"[ \t]*```(?:json)?[ \t]*\n")
_FENCE_END = re.compile(r"\s*```")


@register_parser("deepseek_v3")
class DeepSeekV3Parser(ToolCallParser):
    """Parse and render DeepSeek V3 tool calls (V3.1's short form is parsed too)."""

    #: What goes between two calls.
    between = "\n"

    def parse(self, text: str) -> ParsedTurn:
        found = _CALL_START.search(text)
        if not found:
            return ParsedTurn(content=text)
        turn = ParsedTurn(content=text[: found.start()].strip())
        pos, breaks = found.start(), ForwardFinder(text, "\n")
        while (begin := text.find(CALL_BEGIN, pos)) >= 0:
            pos = _read_call(text, begin + len(CALL_BEGIN), turn, breaks)
        return marker_without_call(turn, found.group())

    def render(self, content: str, tool_calls: list[ToolCall]) -> str:
        refuse_call_start(self.name, content, _CALL_START)
        if not tool_calls:
            return content
        calls = self.between.join(self._call_text(c) for c in tool_calls)
        return f"{content}{CALLS_BEGIN}{calls}{CALLS_END}"

    def _call_text(self, call: ToolCall) -> str:
        return (f"{CALL_BEGIN}function{SEP}{_checked_name(self.name, call.name)}\n```json\n"
                f"{json.dumps(call.arguments, ensure_ascii=False)}\n```{CALL_END}")  # fmt: skip


@register_parser("deepseek_v31")
class DeepSeekV31Parser(DeepSeekV3Parser):
    """DeepSeek V3.1's tool calls: ``NAME<sep>{json}``, back to back (V3's are parsed too)."""

    between = ""

    def _call_text(self, call: ToolCall) -> str:
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        return f"{CALL_BEGIN}{_checked_name(self.name, call.name)}{SEP}{arguments}{CALL_END}"


def _read_call(text: str, pos: int, turn: ParsedTurn, breaks: ForwardFinder) -> int:
    """Read the call whose header starts at ``pos`` into ``turn``; return where to go on.

    V3's header is ``function<sep>NAME`` + a line break + a json code fence; V3.1's is
    ``NAME<sep>`` with the JSON right after it.
    """
    sep = text.find(SEP, pos)
    if sep < 0:
        turn.errors.append(f"malformed tool call {text[pos : pos + 200]!r}: no {SEP}")
        return len(text)
    after = sep + len(SEP)
    line_end = breaks.find(after)
    header = _V3_FENCE.match(text, line_end + 1) if line_end >= 0 else None
    if header:
        name, start = text[after:line_end].strip(), header.end()
    else:
        name, start = text[pos:sep], after
    try:
        obj, end = json_raw_decode(text, skip_space(text, start))
        call = call_from_json({"name": name, "arguments": obj})
    except (ValueError, TypeError) as exc:
        turn.errors.append(f"malformed tool call {text[pos : pos + 200]!r}: {exc}")
        close = text.find(CALL_END, start)
        return len(text) if close < 0 else close + len(CALL_END)
    turn.tool_calls.append(call)
    fence = _FENCE_END.match(text, end) if header else None
    return fence.end() if fence else end


def _checked_name(parser: str, name: str) -> str:
    markers = (SEP, CALL_BEGIN, CALL_END)
    if "\n" in name or name != name.strip() or any(marker in name for marker in markers):
        raise ValueError(
            f"{parser} cannot render tool name {name!r}: no newlines, markers, or spaces "
            "around it (parse strips them)"
        )
    return name
