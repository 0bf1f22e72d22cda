"""`agentgym check` with the `vllm:<name>` parsers on families' chat-template behaviour.

Found by running `agentgym check ENV --tokenizer DIR --env-arg parser=vllm:<name>` on the real
Qwen2.5, Qwen3 and Mistral-7B-Instruct-v0.3 templates (not copied; the templates used here are
the small ones of `tests/test_check_families.py`, plus a Qwen2.5-like one): the route
`docs/parsers.md` offers to parse exactly as a vLLM server failed the round trip where the
shipped parser of the same name passed, for two reasons of the adapter's, not the template's:

- vLLM's hermes parser keeps the line break between the text and ``<tool_call>`` in the
  content; Qwen2.5's and Qwen3's templates write content + ``"\\n<tool_call>"``, so a fresh
  render of the env's history doubled the break (blamed as "calls the parser does not read").
- vLLM's Mistral parser makes up a fresh id for every call, so the template wrote ids the
  model never sampled (blamed on the parser's render).
"""

from __future__ import annotations

import pytest

from agentgym.parsers import get_parser
from tests.conftest import require
from tests.test_check_families import (
    _CHATML_TURNS,
    _HERMES_CALLS,
    _QWEN_TOOL_RESULTS,
    MISTRAL_V03_LIKE,
    rows,
)

pytestmark = pytest.mark.vllm

# Qwen2.5-Instruct: ChatML that keeps every turn as written, content then "\n" + each call.
QWEN25_LIKE = (
    "{%- for m in messages %}" + _CHATML_TURNS + "{%- elif m.role == 'assistant' %}"
    "{%- set content = m.content %}{{- '<|im_start|>assistant\\n' + content }}"
    + _HERMES_CALLS
    + _QWEN_TOOL_RESULTS
    + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_vllm_hermes_on_a_qwen25_template_renders_text_before_a_call_as_produced() -> None:
    require("vllm")
    turn = get_parser("vllm:hermes").parse(
        'Let me check.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    )
    assert turn.content == "Let me check."  # stripped, as the shipped parsers give it
    found = rows(QWEN25_LIKE, parser="vllm:hermes")
    round_trip = found["chat template round trip"]
    assert round_trip.verdict == "pass", round_trip.detail
    assert round_trip.detail == "3 assistant turns render as produced"
    assert found["rollout mode"].detail.startswith("concat: 3 turns"), found["rollout mode"]


def test_vllm_mistral_keeps_the_id_the_model_wrote() -> None:
    require("vllm")
    text = '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}, "id": "aB3dE6gH9"}]'
    assert [c.id for c in get_parser("vllm:mistral").parse(text).tool_calls] == ["aB3dE6gH9"]
    # an id of another shape is not the model's to keep: vLLM's own (9 characters) stands
    (call,) = get_parser("vllm:mistral").parse(text.replace("aB3dE6gH9", "call_1_0")).tool_calls
    assert call.id != "call_1_0" and len(call.id) == 9 and call.id.isalnum()
    round_trip = rows(MISTRAL_V03_LIKE, parser="vllm:mistral")["chat template round trip"]
    # turn 1 renders as produced (its id included); only the family's dropped text warns
    assert round_trip.verdict == "warn", round_trip.detail
    assert round_trip.detail.startswith("assistant turn 2 was produced as"), round_trip.detail
    assert "drops the text before a tool call" in round_trip.detail
