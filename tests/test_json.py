"""`agentgym._json.loads` gives what `json.loads` gives: the same values and the same errors."""

from __future__ import annotations

import json
import math

import pytest

from agentgym._json import loads

TEXTS = [
    '{"name": "multiply", "arguments": {"a": 6, "b": 7}}',
    "[1, 2.5, null, true, false]",
    '"text"',
    "42",
    "NaN",
    ' {"a": 1} \n',  # surrounding JSON whitespace
    '\u00a0{"a": 1}',  # not JSON whitespace
    '{"a": 1} extra',
    '{"a": 1}{"b": 2}',
    '{"a": }',
    '{"a": 1',
    "",
    "   ",
    "\ufeff{}",  # a byte-order mark
    '{"a": "\\ud800"}',
    '{"a": [' * 3 + "]" * 3,
]


@pytest.mark.parametrize("text", TEXTS)
def test_loads_matches_json_loads(text: str) -> None:
    try:
        expected = json.loads(text)
    except ValueError as exc:
        with pytest.raises(type(exc)) as got:
            loads(text)
        assert str(got.value) == str(exc)
    else:
        value = loads(text)
        if isinstance(expected, float) and math.isnan(expected):
            assert math.isnan(value)
        else:
            assert value == expected and type(value) is type(expected)
