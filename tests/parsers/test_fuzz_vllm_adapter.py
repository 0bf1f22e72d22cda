"""The vLLM adapter on hostile text: never raises, and deep arguments are a parse error as in
our own parsers (`MAX_DEPTH`), whatever vLLM's parser accepted."""

from __future__ import annotations

import pytest

from agentgym.parsers import ParsedTurn, get_parser

pytestmark = pytest.mark.vllm

DEEP = 100_000
TEXTS = {
    "hermes": [
        '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 150 + "]" * 150 + "}}</tool_call>",
        '<tool_call>{"name": "f", "arguments": ' + "[" * DEEP + "}</tool_call>",
        "<tool_call>" + "{" * DEEP,
        '<tool_call>{"name": "f", "arguments": {"a": "\\ud800\x00"}}</tool_call>',
        "<tool_call>" * 5000,
    ],
    "mistral": [
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": ' + "[" * 150 + "]" * 150 + "}}]",
        "[TOOL_CALLS]" + "[" * DEEP,
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": ' + "1" * 5000 + "}}]",
    ],
}
CASES = [(name, text) for name, texts in TEXTS.items() for text in texts]


@pytest.mark.parametrize(
    ("name", "text"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)]
)
def test_vllm_adapter_never_raises_and_rejects_deep_arguments(name: str, text: str) -> None:
    turn = get_parser(f"vllm:{name}").parse(text)
    assert isinstance(turn, ParsedTurn)
    assert all(isinstance(c.arguments, dict) for c in turn.tool_calls)
    if "[" * 150 in text and text.count("[") < 1000:
        assert turn.tool_calls == [] and turn.errors
