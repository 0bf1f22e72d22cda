"""Property and fuzz tests of our tool-call parsers on what a policy under RL may write.

Three promises, checked on random and on hand-built worst-case text for every parser:

1. `parse` never raises and returns a well-typed `ParsedTurn`; a call it cannot read is an
   entry of ``errors`` (the env turns it into a tool message), and no text of up to ~100 KB
   takes more than ~0.5 s (no quadratic loops, no regex backtracking).
2. ``parse(render(content, calls))`` gives back the calls (and the content, stripped when
   there are calls), or `render` raises `ValueError`: it never writes text that reads back
   differently.
3. `parse` is deterministic: same result on a fresh parser, in another order, in another
   thread, and deeper in the call stack (deep JSON must not succeed or fail by stack depth).
"""

from __future__ import annotations

import json
import keyword
import math
import sys
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentgym.parsers import ParsedTurn, ToolCall, ToolCallParser, get_parser
from tests.parsers.test_parsers import PARSERS as EVERY_PARSER

#: One tool whose schema types its argument ``s`` as a string (Qwen3-Coder reads values by it).
SCHEMA = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"s": {"type": "string"}}},
        },
    }
]
#: Every parser and render style of the parser tests, and Qwen3-Coder typing values by schema.
PARSERS: list[tuple[str, str, dict[str, Any]]] = [
    *EVERY_PARSER, ("qwen3_coder-typed", "qwen3_coder", {"tools": SCHEMA})
]
IDS = [p[0] for p in PARSERS]


def make(pid: str) -> ToolCallParser:
    _, name, kwargs = next(p for p in PARSERS if p[0] == pid)
    return get_parser(name, **kwargs)


DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

#: Pieces of markup of every format, so random text hits the parsers' paths, not just content.
TOKENS = [
    "<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>", "<function=", "<function=f>",
    "</function>", "<parameter=", "<parameter=a>", "</parameter>", "<|python_tag|>",
    "[TOOL_CALLS]", "[ARGS]", DS_CALLS, DS_CALLS_END, DS_CALL, DS_END, DS_SEP, "function",
    "\n```json\n", "```", '{"name": ', '"f"', '"arguments": ', '"parameters": ', "{", "}", "[",
    "]", "(", ")", ":", ",", ";", "=", '"', "'", "\\", "\\u", "\\ud800", "\n", " ", "\t", "\r",
    "\x00", "null", "true", "True", "None", "NaN", "Infinity", "-Infinity", "1e999", "-0",
    "1" * 30, "f", "a", "g(", "[f(", "\n[f(a=", "math.sqrt", "é", "✓", "\ud800", "\udfff",
    "\u2028", "\x85", "\ufeff", "ﬁ",
]  # fmt: skip
ANY_CHAR = st.characters(codec=None, categories=None)  # every code point, surrogates included
GARBLE = st.lists(st.sampled_from(TOKENS) | st.text(ANY_CHAR, max_size=4), max_size=40).map("".join)
FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def check_turn(turn: Any) -> None:
    """The shape the env relies on: content text, calls with a name and an object, errors text."""
    assert isinstance(turn, ParsedTurn)
    assert isinstance(turn.content, str)
    for call in turn.tool_calls:
        assert isinstance(call, ToolCall)
        assert isinstance(call.name, str) and call.name
        assert isinstance(call.arguments, dict)
        assert all(isinstance(k, str) for k in call.arguments)
        assert isinstance(call.id, str)
    assert all(isinstance(e, str) and e for e in turn.errors)


def snapshot(turn: ParsedTurn) -> str:
    """A comparable picture of a turn (repr, so NaN equals NaN and 1 differs from 1.0/True)."""
    return repr((turn.content, [(c.name, c.arguments, c.id) for c in turn.tool_calls], turn.errors))


# ---- 1. parse never raises ---------------------------------------------------------------
@pytest.mark.parametrize("pid", IDS)
@FUZZ
@given(text=GARBLE)
def test_parse_never_raises_on_garbled_markup(pid: str, text: str) -> None:
    parser = make(pid)
    turn = parser.parse(text)
    check_turn(turn)
    assert snapshot(parser.parse(text)) == snapshot(turn)


@pytest.mark.parametrize("pid", IDS)
@FUZZ
@given(data=st.data())
def test_parse_never_raises_on_damaged_rendered_turns(pid: str, data: st.DataObject) -> None:
    """A valid turn cut, spliced or garbled anywhere (a stop string cut midway, a lost token)."""
    parser = make(pid)
    calls = [ToolCall("f", {"a": [1, {"b": "c\n"}], "s": "x"}), ToolCall("g", {})]
    text = parser.render("Thinking.", calls)
    cut = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(cut, len(text)))
    insert = data.draw(GARBLE)
    for damaged in (text[:cut], text[:cut] + text[end:], text[:cut] + insert + text[cut:]):
        check_turn(parser.parse(damaged))


def _one_call(pid: str, args: str, name: str = '"f"') -> str:
    """A call of the format whose arguments slot holds the raw text ``args``."""
    if pid.startswith("hermes"):
        return f'<tool_call>\n{{"name": {name}, "arguments": {args}}}\n</tool_call>'
    if pid.startswith("llama3_json"):
        return f'{{"name": {name}, "parameters": {args}}}'
    if pid == "mistral-json":
        return f'[TOOL_CALLS] [{{"name": {name}, "arguments": {args}}}]'
    if pid == "mistral-args":
        return f"[TOOL_CALLS]f[ARGS]{args}"
    if pid == "deepseek_v3":
        return f"{DS_CALLS}{DS_CALL}function{DS_SEP}f\n```json\n{args}\n```{DS_END}{DS_CALLS_END}"
    if pid == "deepseek_v31":
        return f"{DS_CALLS}{DS_CALL}f{DS_SEP}{args}{DS_END}{DS_CALLS_END}"
    if pid.startswith("qwen3_coder"):
        parameter = f"<parameter=a>\n{args}\n</parameter>"
        return f"<tool_call>\n<function=f>\n{parameter}\n</function>\n</tool_call>"
    assert pid == "pythonic"
    return f"[f(a={args})]"


JSON_FORMATS = ["hermes", "llama3_json", "mistral-json", "mistral-args", "deepseek_v3",
                "deepseek_v31"]  # fmt: skip
NAMED_FORMATS = ["hermes", "llama3_json", "mistral-json"]  # the name is a JSON value
DEEP = 100_000

#: Arguments no format may accept as a call: (id, raw JSON in the arguments slot).
BAD_ARGUMENTS = [
    ("100k [", "[" * DEEP),
    ("100k {", '{"a": ' * DEEP),
    ("deep closed", '{"a": ' + "[" * 5000 + "]" * 5000 + "}"),
    ("list", "[1, 2]"),
    ("number", "7"),
    ("NaN", "NaN"),
    ("string", '"not json"'),
    ("string holding deep JSON", json.dumps("[" * DEEP)),
    ("string holding a list", '"[1]"'),
    ("huge int", '{"a": ' + "1" * 5000 + "}"),
    ("cut", '{"a": "b'),
    ("null byte", '{"a": 1\x00}'),
]


def _applies(pid: str, case: str, args: str) -> bool:
    """Whether a bad-arguments case means something in format ``pid``."""
    if pid == "mistral-args":  # the args style reads only an object after [ARGS]
        return args.startswith("{")
    # DeepSeek arguments are JSON, never a string holding JSON
    return not (pid.startswith("deepseek") and case.startswith("string holding"))


@pytest.mark.parametrize(
    ("pid", "case", "args"),
    [(pid, case, args) for case, args in BAD_ARGUMENTS for pid in JSON_FORMATS
     if _applies(pid, case, args)],
    ids=[f"{case}-{pid}" for case, args in BAD_ARGUMENTS for pid in JSON_FORMATS
         if _applies(pid, case, args)],
)  # fmt: skip
def test_bad_json_arguments_are_parse_errors(pid: str, case: str, args: str) -> None:
    turn = timed(make(pid), "Hi\n" + _one_call(pid, args))
    check_turn(turn)
    assert turn.tool_calls == [] and turn.errors, snapshot(turn)[:300]
    assert turn.content == "Hi"


#: Arguments that are fine however odd: (id, raw JSON, the arguments read).
ODD_ARGUMENTS = [
    ("NaN value", '{"a": NaN, "b": -Infinity}', {"a": math.nan, "b": -math.inf}),
    ("duplicate keys", '{"a": 1, "a": 2}', {"a": 2}),
    ("surrogate escape", '{"a": "\\ud800\\udc00 \\udfff"}', {"a": "\U00010000 \udfff"}),
    ("null byte escape", '{"a": "\\u0000"}', {"a": "\x00"}),
    ("big int", '{"a": ' + "9" * 4000 + "}", {"a": int("9" * 4000)}),
    ("float overflow", '{"a": 1e999}', {"a": math.inf}),
    ("nested 50", '{"a": ' + "[" * 50 + "]" * 50 + "}", {"a": json.loads("[" * 50 + "]" * 50)}),
]


@pytest.mark.parametrize("pid", JSON_FORMATS)
@pytest.mark.parametrize(("case", "args", "want"), ODD_ARGUMENTS, ids=[c[0] for c in ODD_ARGUMENTS])
def test_odd_but_valid_json_arguments_are_read(pid: str, case: str, args: str, want: dict) -> None:
    turn = timed(make(pid), _one_call(pid, args))
    assert turn.errors == []
    assert [(c.name, repr(c.arguments)) for c in turn.tool_calls] == [("f", repr(want))]


@pytest.mark.parametrize("pid", NAMED_FORMATS)
@pytest.mark.parametrize("name", ['""', "3", "null", '["f"]', '{"a": 1}', "[" * DEEP, '"f'])
def test_bad_names_are_parse_errors(pid: str, name: str) -> None:
    turn = timed(make(pid), _one_call(pid, "{}", name=name))
    check_turn(turn)
    assert turn.tool_calls == [] and turn.errors


@pytest.mark.parametrize("pid", ["pythonic", "qwen3_coder", "qwen3_coder-typed"])
@pytest.mark.parametrize(
    "value",
    [
        "[" * DEEP,
        "[" * 150 + "]" * 150,
        "-" * DEEP + "1",
        "not " * 20_000 + "1",
        "1" + "+1" * 30_000,
        "1" * 5000,
        "'\\ud800'",
        "'\x00'",
        '"""' + "x" * DEEP,
    ],
)
def test_odd_literal_values_never_raise(pid: str, value: str) -> None:
    turn = timed(make(pid), _one_call(pid, value))
    check_turn(turn)
    assert len(turn.tool_calls) + len(turn.errors) == 1


@pytest.mark.parametrize("pid", IDS)
def test_thousands_of_calls_in_one_reply(pid: str) -> None:
    parser = make(pid)
    calls = [ToolCall(f"f{i}", {"i": i}) for i in range(3000)]
    turn = timed(parser, parser.render("", calls))
    assert turn.errors == []
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        (c.name, c.arguments) for c in calls
    ]


# ---- 1b. time: worst cases for every search and regex ---------------------------------------
SIZE = 100_000
LIMIT_S = 1.5  # linear parsers take under 0.05 s; a quadratic one takes seconds (2.3 s seen)
#: `ast.parse` alone reads Python at about 0.3 s per 100 KB here: linear, but close to LIMIT_S.
PYTHONIC_LIMIT_S = 3.0


def fill(unit: str, prefix: str = "", suffix: str = "") -> str:
    """``prefix`` + ``unit`` repeated to about SIZE characters + ``suffix``."""
    return prefix + unit * (SIZE // len(unit)) + suffix


def timed(parser: ToolCallParser, text: str) -> ParsedTurn:
    """``parser.parse(text)``, asserting it took less than the limit (best of two runs)."""
    limit = PYTHONIC_LIMIT_S if parser.name == "pythonic" else LIMIT_S
    best, turn = math.inf, None
    for _ in range(2):
        start = time.perf_counter()
        turn = parser.parse(text)
        best = min(best, time.perf_counter() - start)
        if best < limit:
            break
    assert best < limit, f"{parser.name} took {best:.2f}s on {text[:80]!r}... ({len(text)} chars)"
    assert turn is not None
    return turn


WORST_CASES = {
    "hermes": [
        fill("<tool_call>"),
        fill("<tool_call>x</tool_call>"),
        fill("<tool_call>{}</tool_call>"),
        fill('<tool_call>{"name": "f", "arguments": {}}</tool_call>'),
        fill("</tool_call>"),
    ],
    "llama3_json": [
        fill('\n{"name": "f", "parameters": {}}'),
        fill('{"name": "f"};'),
        fill("\n" + " " * 50),
        fill(" ", "\n"),
        fill('\n{ "name" '),
        fill(" ", '\n{"name"'),
        fill("<|python_tag|>"),
        fill("{"),
        fill('"', "\n{"),
    ],
    "mistral": [
        fill("[TOOL_CALLS]"),
        fill("[TOOL_CALLS]f"),
        fill("[TOOL_CALLS]f[ARGS]{"),
        fill("[TOOL_CALLS][1]"),
        fill(" ", "[TOOL_CALLS]"),
        fill("f", "[TOOL_CALLS]"),
        fill(" f", "[TOOL_CALLS]"),
        fill('[TOOL_CALLS]{"name": "f"}'),
        fill("[", "[TOOL_CALLS]"),
    ],
    "pythonic": [
        fill("a", "\n["),
        fill("\n[a.a.a"),
        fill("\n[ \n"),
        fill(" ", "\n[f"),
        fill(" f(),", "\n[f(),", "]"),
        fill("a=1,", "[f(", ")]"),
        fill("1,", "[f(a=[", "])]"),
        fill("x", "[f(a='", "')]"),
        fill("(", "[f(a="),
    ],
    "qwen3_coder": [
        fill("<function=f>x</tool_call>"),
        fill("<function=f><parameter=a>x</tool_call>"),
        fill("<tool_call><function=f><parameter=a>"),
        fill("<function=f><parameter=a>1</parameter>"),
        fill("<function=\n</tool_call>"),
        fill("<function=f>>"),
        fill("<tool_call>"),
        fill("<function=f></function>"),
    ],
    "deepseek_v3": [
        fill(DS_CALL + "f" + DS_SEP + "{}", DS_CALLS),
        fill(DS_CALL + "f" + DS_SEP + "{" + DS_END, DS_CALLS),
        fill(DS_CALL + "f" + DS_SEP + "x", DS_CALLS),
        fill(DS_CALL + DS_SEP, DS_CALLS),
        fill(DS_CALL, DS_CALLS),
        fill(f"{DS_CALL}function{DS_SEP}f\n```json\n{{}}\n```{DS_END}", DS_CALLS),
        fill(f"{DS_CALL}function{DS_SEP}f\n```json\n[1]\n```{DS_END}", DS_CALLS),
        fill(" ", DS_CALLS + DS_CALL + "f" + DS_SEP + "\n"),
        fill(" ", DS_CALLS + DS_CALL + "f" + DS_SEP + "x\n"),
    ],
}
WORST = [(name, i, text) for name, texts in WORST_CASES.items() for i, text in enumerate(texts)]


@pytest.mark.parametrize(("name", "i", "text"), WORST, ids=[f"{n}-{i}" for n, i, _ in WORST])
def test_worst_case_inputs_parse_in_linear_time(name: str, i: int, text: str) -> None:
    check_turn(timed(get_parser(name), text))


@pytest.mark.parametrize("pid", IDS)
@settings(derandomize=True, deadline=None, max_examples=20)
@given(unit=GARBLE.filter(bool))
def test_random_text_repeated_to_100kb_parses_in_time(pid: str, unit: str) -> None:
    check_turn(timed(make(pid), fill(unit)))


# ---- 2. render then parse -------------------------------------------------------------------
#: Characters that mean something to a format, or that `str.strip`/`\s`/NFKC treat specially.
TRICKY = st.sampled_from(TOKENS + ["\x1c", "\xa0", "\u3000", "µ", "ª", "K", " "]) | st.text(
    ANY_CHAR, max_size=3
)
TRICKY_TEXT = st.lists(TRICKY, max_size=8).map("".join)
ASCII_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
PLAIN_NAME = st.builds(
    str.__add__, st.sampled_from(ASCII_LETTERS), st.text(ASCII_LETTERS + "0123456789", max_size=8)
).filter(lambda s: not keyword.iskeyword(s))
NUMBERS = (
    st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0, -0.0, 1.0, 10**300, 1e300, 5e-324])
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | NUMBERS | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=10,
)
PLAIN_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text("abc xyz.", max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(PLAIN_NAME, inner, max_size=3),
    max_leaves=6,
)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same JSON types throughout (1, 1.0 and True differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def assert_round_trip(parser: ToolCallParser, content: str, calls: list[ToolCall]) -> bool:
    """Render and parse back; False when `render` refused (ValueError) what it cannot write."""
    try:
        text = parser.render(content, calls)
    except ValueError:
        return False
    turn = parser.parse(text)
    assert turn.errors == [], (text, turn.errors)
    assert turn.content == (content.strip() if calls else content), text
    assert [c.name for c in turn.tool_calls] == [c.name for c in calls], text
    for got, want in zip(turn.tool_calls, calls, strict=True):
        assert same(got.arguments, want.arguments), (text, got.arguments, want.arguments)
    return True


def calls_of(names: st.SearchStrategy[str], keys: st.SearchStrategy[str], values: Any) -> Any:
    call = st.builds(ToolCall, names, st.dictionaries(keys, values, max_size=4))
    return st.lists(call, max_size=4)


@pytest.mark.parametrize("pid", IDS)
@FUZZ
@given(
    content=TRICKY_TEXT,
    calls=calls_of(TRICKY_TEXT.filter(bool), TRICKY_TEXT, JSON_VALUES),
)
def test_render_round_trips_or_refuses(pid: str, content: str, calls: list[ToolCall]) -> None:
    """Anything: `render` writes text that reads back the same, or raises ValueError."""
    assert_round_trip(make(pid), content, calls)


#: Names and keys at each format's edges: whitespace `str.strip` drops but `\s` (ASCII) does
#: not see, identifiers Python rewrites (NFKC: "ﬁ" is "fi"), non-ASCII letters, reserved names.
EDGE_NAMES = [" f", "f ", "\x1cf", "\x85f", "\u3000f", "\xa0f", "ﬁ", "é", "µ", "f.ª", "__debug__"]
EDGE_VALUES = [math.nan, math.inf, -math.inf, [math.nan], {"a": -math.inf}, 10**4000]


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("name", EDGE_NAMES, ids=[ascii(n) for n in EDGE_NAMES])
def test_edge_names_round_trip_or_are_refused(pid: str, name: str) -> None:
    assert_round_trip(make(pid), "", [ToolCall(name, {})])
    assert_round_trip(make(pid), "", [ToolCall("f", {name: 1})])


@pytest.mark.parametrize("pid", IDS)
@pytest.mark.parametrize("value", EDGE_VALUES, ids=[repr(v)[:20] for v in EDGE_VALUES])
def test_non_finite_and_huge_numbers_round_trip_or_are_refused(pid: str, value: Any) -> None:
    assert_round_trip(make(pid), "", [ToolCall("f", {"a": value})])


@pytest.mark.parametrize("pid", IDS)
@settings(FUZZ, max_examples=80)
@given(
    content=st.text("abc xyz.,!?\n", max_size=30),
    calls=calls_of(PLAIN_NAME, PLAIN_NAME, PLAIN_VALUES)
    | calls_of(PLAIN_NAME, PLAIN_NAME, JSON_VALUES),
)
def test_plain_turns_always_render_and_round_trip(
    pid: str, content: str, calls: list[ToolCall]
) -> None:
    """Identifier names and keys, any JSON value: every format writes them (bar qwen3_coder's
    typed parameter ``s``, which must hold a string), and reads them back."""
    parser = make(pid)
    refused_ok = pid == "qwen3_coder-typed" and any(
        c.name == "f" and "s" in c.arguments and not isinstance(c.arguments["s"], str)
        for c in calls
    )
    assert assert_round_trip(parser, content, calls) or refused_ok


# ---- 3. deterministic, no global state --------------------------------------------------------
def _determinism_texts(pid: str) -> list[str]:
    deep = [_one_call(pid, '{"a": ' + "[" * n + "]" * n + "}") for n in (20, 90, 150, 600)]
    pythonic = [f"[f(a={'[' * n}{']' * n})]" for n in (20, 90, 150, 190)]
    rendered = make(pid).render("Hi", [ToolCall("f", {"a": [1, "x"]}), ToolCall("g", {})])
    return (pythonic if pid == "pythonic" else deep) + [rendered, rendered[:-5], "plain"]


def _at_depth(frames: int, fn: Any) -> Any:
    return fn() if frames == 0 else _at_depth(frames - 1, fn)


@pytest.mark.parametrize("pid", IDS)
def test_parse_is_deterministic_and_stateless(pid: str) -> None:
    texts = _determinism_texts(pid)
    first = [snapshot(make(pid).parse(t)) for t in texts]
    shared = make(pid)
    assert [snapshot(shared.parse(t)) for t in reversed(texts)] == first[::-1]
    assert [snapshot(shared.parse(t)) for t in texts] == first

    in_thread: list[str] = []
    thread = threading.Thread(
        target=lambda: in_thread.extend(snapshot(shared.parse(t)) for t in texts)
    )
    thread.start()
    thread.join()
    assert in_thread == first

    # Deep in the stack (an env inside asyncio, a trainer, a debugger) the same JSON must read
    # the same way: whether a call parses cannot hang on how much recursion is left.
    headroom = sys.getrecursionlimit() - 250
    for text, want in zip(texts, first, strict=True):
        deep = _at_depth(headroom - len(_stack()), lambda t=text: _safe(lambda: shared.parse(t)))
        assert deep == want, f"{pid}: parse({text[:60]!r}...) changed deep in the stack"


def _stack() -> list[Any]:
    frame, frames = sys._getframe(), []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back  # type: ignore[assignment]
    return frames


def _safe(fn: Any) -> str:
    try:
        return snapshot(fn())
    except BaseException as exc:  # noqa: BLE001 - recorded and compared
        return f"raised {type(exc).__name__}"
