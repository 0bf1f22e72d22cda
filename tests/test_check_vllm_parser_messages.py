"""`agentgym check` with ``vllm:<name>`` parsers blames what vLLM's parser does, not the format.

vLLM's parsers read differently from ours in two ways the check met on real templates:
``vllm:llama3_json`` drops the text before a call (the template then writes the call alone,
exactly as the parser renders it), and ``vllm:pythonic`` reads a call list only when it is the
whole turn. Its llama3_json parser also logs a traceback for a stray ``{`` (the gymnasium row's
random action), which must not reach the check's output. The template below is written for
this test (a Llama-3.1-like one that writes a call alone, dropping the text before it).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

import agentgym
from agentgym.engine.tiny import make_tokenizer
from agentgym.parsers import get_parser
from tests.conftest import require
from tests.test_check_families import LLAMA31_LIKE

pytestmark = pytest.mark.vllm


def rows(**kwargs: Any) -> dict[str, agentgym.CheckResult]:
    require("vllm")
    tok = make_tokenizer(("<|python_tag|>",))
    tok.chat_template = LLAMA31_LIKE
    results = agentgym.check("calculator", tokenizer=tok, **kwargs)
    assert not [r for r in results if r.name == "check crashed"], results
    return {r.name: r for r in results}


def test_vllm_llama3_json_is_blamed_for_the_text_it_drops_not_for_its_format() -> None:
    """It said "the template writes the same calls as the 'llama3_json' parser does, not as
    'vllm:llama3_json'": both write the same; vLLM's parser lost the text before the call."""
    round_trip = rows(parser="vllm:llama3_json")["chat template round trip"]
    assert not round_trip.passed, round_trip
    detail = round_trip.detail
    assert "the 'vllm:llama3_json' parser drops 'Let me double-check that.'" in detail, detail
    assert "use --env-arg parser=llama3_json" in detail and "which keeps it" in detail, detail
    assert "same calls as the" not in detail, detail


def test_vllm_pythonic_round_trip_row_shows_the_text_and_why_nothing_was_read() -> None:
    """It said "rendered [('calculate', {...})], parsed [] []": no text, no cause, no fix."""
    row = rows(parser="vllm:pythonic")["parser round trip (vllm:pythonic)"]
    assert not row.passed, row
    assert "\n" not in row.detail, row.detail
    assert row.detail.startswith('rendered "Let me check.\\n[calculate(expression='), row.detail
    assert "read no call: 'vllm:pythonic' reads calls only when they are the whole turn" in (
        row.detail
    )
    assert "use --env-arg parser=pythonic" in row.detail, row.detail


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_vllm_parser_traceback_stays_out_while_other_threads_still_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's llama3_json parser logs a traceback (`logger.exception`) for a stray ``{``.

    While the adapter parses, that logger is quiet for the parsing thread only: a record
    another thread logs meanwhile (started from inside the parse) still arrives, and so does
    one after the parse; the parse adds no filter.
    """
    require("vllm")
    parser = get_parser("vllm:llama3_json")
    logger = logging.getLogger("vllm.tool_parsers.llama_tool_parser")
    collect, filters_before = _Collect(), list(logger.filters)
    extract = parser._extract

    def extract_while_another_thread_logs(text: str) -> Any:
        other = threading.Thread(target=logger.error, args=("from another thread",))
        other.start()
        other.join()
        return extract(text)  # vLLM logs its traceback in here

    monkeypatch.setattr(parser, "_extract", extract_while_another_thread_logs)
    logger.addHandler(collect)
    try:
        turn = parser.parse("The set {1, 2} has two items.")
        logger.error("after the parse")
    finally:
        logger.removeHandler(collect)
    assert turn.tool_calls == [] and turn.content == "The set {1, 2} has two items."
    assert [r.getMessage() for r in collect.records] == [
        "from another thread",
        "after the parse",
    ]
    assert logger.filters == filters_before
