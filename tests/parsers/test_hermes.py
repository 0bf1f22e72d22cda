"""The hermes parser's fast paths find what its regex and `call_from_json` would find."""

from __future__ import annotations

import json
import random
import re

from agentgym.parsers import ParsedTurn, ToolCall, get_parser
from agentgym.parsers._base import call_from_json
from agentgym.parsers.hermes import _blocks

_REGEX = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_PIECES = ["<tool_call>", "</tool_call>", "x", '{"name": "f"}', "\n", "<tool", "call>", "</tool"]


def test_blocks_are_what_the_regex_finds() -> None:
    rng = random.Random(0)
    checked = 0
    for _ in range(20_000):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 9)))
        start = text.find("<tool_call>")
        if start >= 0:
            assert list(_blocks(text, start)) == _REGEX.findall(text, start), text
            checked += 1
    assert checked > 5_000


def reference_parse(text: str) -> ParsedTurn:
    """The parser as it was written with the regex and `call_from_json` (the oracle)."""
    found = re.search("<tool_call>", text)
    if not found:
        return ParsedTurn(content=text)
    turn = ParsedTurn(content=text[: found.start()].strip())
    for raw in _REGEX.findall(text, found.start()):
        try:
            turn.tool_calls.append(call_from_json(json.loads(raw.strip())))
        except (ValueError, TypeError) as exc:
            turn.errors.append(f"malformed <tool_call> {raw.strip()[:200]!r}: {exc}")
    return turn


def test_parse_matches_the_reference_on_odd_calls() -> None:
    texts = [
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>',  # string args
        '<tool_call>{"name": "add"}</tool_call><tool_call>{"name": "", "arguments": {}}',
        '<tool_call>{"name": "add", "arguments": null, "id": "x"}</tool_call>',
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        "<tool_call>[1, 2]</tool_call>",
        '<tool_call>{"name": "a", "arguments": {}} trailing</tool_call>',
        '<tool_call>\u00a0{"name": "a", "arguments": {}}</tool_call>',
        "No call at all.",
    ]
    parser = get_parser("hermes")
    for text in texts:
        assert parser.parse(text) == reference_parse(text), text


def test_well_formed_call_is_parsed() -> None:
    turn = get_parser("hermes").parse(
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2]}}\n</tool_call>'
    )
    assert turn == ParsedTurn(content="", tool_calls=[ToolCall("add", {"a": 1, "b": [2]})])
