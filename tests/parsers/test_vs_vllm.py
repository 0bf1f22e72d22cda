"""Our parsers against vLLM's own (through `VLLMToolParser`) on the same texts.

Each case states what our parser returns. Where vLLM agrees, that is all; where it differs on
purpose, the case spells out vLLM's result and ``why`` says the reason (also in
docs/parsers.md). The common difference: vLLM's parsers are all-or-nothing (one malformed call
and the whole turn comes back as plain content, no calls, no error), while ours keep the good
calls and report each bad one in ``ParsedTurn.errors`` so the env can tell the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from agentgym.parsers import ParsedTurn, ToolCallParser, get_parser
from tests.conftest import require

pytestmark = pytest.mark.vllm

SAME: Any = object()  # "vLLM gives what we give"
RAW: Any = object()  # vLLM content: the whole input text


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    calls: list[tuple[str, dict]]  # our (name, arguments)
    content: str = ""  # our content
    errors: bool = False  # we report at least one error
    vllm_calls: Any = SAME  # vLLM's (name, arguments), or SAME
    vllm_content: Any = SAME  # vLLM's content (None counts as ""), SAME, or RAW
    vllm_errors: bool = False  # the adapter reports an error (vLLM returned unusable arguments)
    why: str = ""  # required whenever vLLM's result differs from ours
    vllm_kwargs: dict = field(default_factory=dict)


ALL_OR_NOTHING = "vLLM returns the whole text as content on any malformed call; we report it"


def all_or_nothing(id: str, text: str) -> Case:
    """A malformed turn: no calls and an error from us, the whole text as content from vLLM."""
    return Case(id, text, [], errors=True, vllm_content=RAW, why=ALL_OR_NOTHING)


HERMES = [
    Case(
        "single",
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
        [("f", {"a": 1})],
    ),
    Case(
        "several",
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "g", "arguments": {"b": [1, 2]}}</tool_call>',
        [("f", {}), ("g", {"b": [1, 2]})],
    ),
    Case(
        "content+call",
        'Let me check.\n<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
        [("f", {"a": 1})],
        content="Let me check.",
    ),
    Case("no call", "The answer is 42.", [], content="The answer is 42."),
    all_or_nothing(
        "malformed json",
        '<tool_call>{"name": "f", "arguments": {"a": 1,}}</tool_call>',
    ),
    Case(
        "unclosed tag, complete json",
        '<tool_call>{"name": "f", "arguments": {"a": 1}}',
        [("f", {"a": 1})],
    ),
    all_or_nothing("unclosed tag, truncated json", '<tool_call>{"name": "f", "arguments": {"a": 1'),
    Case(
        "good call + bad call",
        '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>',
        [("f", {})],
        errors=True,
        vllm_calls=[],
        vllm_content=RAW,
        why="vLLM drops the good call too (all-or-nothing); we keep it and report the bad one",
    ),
    Case(
        "wrong type: arguments a list",
        '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>',
        [],
        errors=True,
        vllm_errors=True,  # vLLM returns arguments "[1, 2]"; the adapter rejects a non-object
    ),
    all_or_nothing(
        "wrong type: name a number",
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
    ),
    Case(
        "missing arguments",
        '<tool_call>{"name": "now"}</tool_call>',
        [("now", {})],
        vllm_calls=[],
        vllm_content=RAW,
        why="a call without 'arguments' means no arguments to us; vLLM requires the key",
    ),
    Case(
        "arguments as a JSON string",
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        [("f", {"a": 1})],
        vllm_calls=[],
        vllm_errors=True,
        why="we decode string-encoded arguments; vLLM JSON-encodes the string a second time",
    ),
    Case(
        "unicode",
        'Voilà ✓\n<tool_call>{"name": "traduire", "arguments": {"t": "日本語 ½"}}</tool_call>',
        [("traduire", {"t": "日本語 ½"})],
        content="Voilà ✓",
    ),
]

LLAMA3_JSON = [
    Case("single", '{"name": "f", "parameters": {"a": 1}}', [("f", {"a": 1})]),
    Case(
        "several",
        '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}',
        [("f", {"a": 1}), ("g", {})],
    ),
    Case("python tag", '<|python_tag|>{"name": "f", "parameters": {"a": 1}}', [("f", {"a": 1})]),
    Case("arguments key", '{"name": "f", "arguments": {"a": 1}}', [("f", {"a": 1})]),
    Case(
        "content+call",
        'Sure!\n{"name": "f", "parameters": {"a": 1}}',
        [("f", {"a": 1})],
        content="Sure!",
        vllm_content="",
        why="vLLM drops all text around the JSON calls; we keep the text before them",
    ),
    Case("no call", "The answer is 42.", [], content="The answer is 42."),
    Case("braces in prose", "Use {x} as the key.", [], content="Use {x} as the key."),
    all_or_nothing("malformed json", '{"name": "f", "parameters": {"a": 1,}}'),
    all_or_nothing(
        "unclosed (truncated) call",
        '<|python_tag|>{"name": "f", "parameters": {"a": 1',
    ),
    Case(
        "wrong type: parameters a list",
        '{"name": "f", "parameters": [1, 2]}',
        [],
        errors=True,
        vllm_errors=True,
    ),
    Case(
        "missing parameters",
        '{"name": "now"}',
        [("now", {})],
        vllm_calls=[],
        vllm_content=RAW,
        why="a call without parameters means no arguments to us; vLLM requires the key",
    ),
    Case(
        "call inside a sentence",
        'I would call {"name": "f", "parameters": {}} here.',
        [],
        content='I would call {"name": "f", "parameters": {}} here.',
        vllm_calls=[("f", {})],
        vllm_content="",
        why="vLLM takes any JSON object anywhere as a call; ours only at a line start or tag",
    ),
    Case(
        "unicode",
        '{"name": "traduire", "parameters": {"t": "日本語 ½ ✓"}}',
        [("traduire", {"t": "日本語 ½ ✓"})],
    ),
]

MISTRAL = [
    Case(
        "single",
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]',
        [("f", {"a": 1})],
    ),
    Case(
        "several",
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]',
        [("f", {"a": 1}), ("g", {})],
    ),
    Case("bare object", '[TOOL_CALLS]{"name": "f", "arguments": {"a": 1}}', [("f", {"a": 1})]),
    Case(
        "content+call",
        'Checking.[TOOL_CALLS][{"name": "f", "arguments": {}}]',
        [("f", {})],
        content="Checking.",
    ),
    Case("no call", "The answer is 42.", [], content="The answer is 42."),
    Case(
        "arguments as a JSON string",
        '[TOOL_CALLS][{"name": "f", "arguments": "{\\"a\\": 1}"}]',
        [("f", {"a": 1})],
    ),
    Case(
        "malformed json",
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1,}}]',
        [],
        errors=True,
        vllm_content='[{"name": "f", "arguments": {"a": 1,}}]',
        why="vLLM returns the text after [TOOL_CALLS] as content; we report the call",
    ),
    Case(
        "unclosed (truncated) array",
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "argu',
        [],
        errors=True,
        vllm_content='[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "argu',
        why="vLLM returns the text after [TOOL_CALLS] as content; we report the call",
    ),
    Case(
        "wrong type: arguments a number",
        '[TOOL_CALLS][{"name": "f", "arguments": 7}]',
        [],
        errors=True,
        vllm_errors=True,
    ),
    Case(
        "wrong type: name a number",
        '[TOOL_CALLS][{"name": 3, "arguments": {}}]',
        [],
        errors=True,
        vllm_calls=[("", {})],
        why="vLLM turns a non-string name into a call named ''; we report it",
    ),
    Case(
        "v11 form with a pre-v11 tokenizer",
        '[TOOL_CALLS]f[ARGS]{"a": 1}',
        [("f", {"a": 1})],
        vllm_calls=[],
        vllm_content='f[ARGS]{"a": 1}',
        why="vLLM picks one form from the tokenizer (no [ARGS] token: JSON only); we read both",
    ),
    Case(
        "unicode",
        'Voilà[TOOL_CALLS][{"name": "f", "arguments": {"t": "日本語 ½ ✓"}}]',
        [("f", {"t": "日本語 ½ ✓"})],
        content="Voilà",
    ),
]

V11 = {"extra_tokens": ("[ARGS]",)}  # a v11+ Mistral tokenizer: vLLM parses name[ARGS]{...}
MISTRAL_V11 = [
    Case("single", '[TOOL_CALLS]f[ARGS]{"a": 1}', [("f", {"a": 1})], vllm_kwargs=V11),
    Case(
        "several",
        '[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}',
        [("f", {"a": 1}), ("g", {})],
        vllm_kwargs=V11,
    ),
    Case(
        "content+call",
        'Checking.[TOOL_CALLS]f[ARGS]{"a": 1}',
        [("f", {"a": 1})],
        content="Checking.",
        vllm_kwargs=V11,
    ),
    Case(
        "no [ARGS], trailing text",
        '[TOOL_CALLS]f{"a": 1} and some words',
        [("f", {"a": 1})],
        vllm_kwargs=V11,
    ),
    Case("no call", "The answer is 42.", [], content="The answer is 42.", vllm_kwargs=V11),
    Case(
        "malformed (truncated) arguments",
        '[TOOL_CALLS]f[ARGS]{"a": 1',
        [],
        errors=True,
        vllm_errors=True,  # vLLM returns the call with arguments '{"a": 1'; adapter rejects it
        vllm_kwargs=V11,
    ),
    Case(
        "pre-v11 JSON form with a v11 tokenizer",
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]',
        [("f", {"a": 1})],
        vllm_calls=[("[", {"name": "f", "arguments": {"a": 1}})],
        why="vLLM's v11 path reads '[' as the tool name; we read the JSON form as well",
        vllm_kwargs=V11,
    ),
    Case(
        "unicode",
        '[TOOL_CALLS]traduire[ARGS]{"t": "日本語 ½ ✓"}',
        [("traduire", {"t": "日本語 ½ ✓"})],
        vllm_kwargs=V11,
    ),
]

PYTHONIC = [
    Case("single", '[f(a=1, b="x")]', [("f", {"a": 1, "b": "x"})]),
    Case(
        "several",
        "[f(a=1), g(), h(x=[1, 2], y={'k': None})]",
        [("f", {"a": 1}), ("g", {}), ("h", {"x": [1, 2], "y": {"k": None}})],
    ),
    Case(
        "json literals, negatives",
        "[f(a=true, b=null, c=-2.5)]",
        [("f", {"a": True, "b": None, "c": -2.5})],
    ),
    Case(
        "dotted name",
        "[math.sqrt(x=16)]",
        [("math.sqrt", {"x": 16})],
        vllm_calls=[],
        vllm_content=RAW,
        why="vLLM's pre-check pattern rejects dotted names (its AST step would accept them)",
    ),
    Case(
        "content+call",
        "Let me look.\n[f(a=1)]",
        [("f", {"a": 1})],
        content="Let me look.",
        vllm_calls=[],
        vllm_content=RAW,
        why="vLLM requires the whole turn to be the call list; we allow text before it",
    ),
    Case("no call", "The answer is 42.", [], content="The answer is 42."),
    all_or_nothing("malformed (unclosed)", "[f(a=1), g(b="),
    all_or_nothing("wrong type: positional argument", "[f(1)]"),
    all_or_nothing("wrong type: variable, not a literal", "[f(a=b)]"),
    Case("unicode", "[traduire(t='日本語 ½ ✓')]", [("traduire", {"t": "日本語 ½ ✓"})]),
]

QWEN3_CODER = [
    Case(
        "single",
        "<tool_call>\n<function=f>\n<parameter=a>\nhello world\n</parameter>\n</function>\n"
        "</tool_call>",
        [("f", {"a": "hello world"})],
    ),
    Case(
        "several",
        "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=g>\n</function>\n</tool_call>",
        [("f", {"a": "x"}), ("g", {})],
    ),
    Case(
        "content+call",
        "Let me check.\n\n<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n"
        "</function>\n</tool_call>",
        [("f", {"a": "x"})],
        content="Let me check.",
    ),
    Case("no call", "The answer is 42.", [], content="The answer is 42."),
    Case(
        "typed values without a schema",
        "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n<parameter=b>\nTrue\n"
        "</parameter>\n</function>\n</tool_call>",
        [("f", {"n": 3, "b": True})],
        vllm_calls=[("f", {"n": "3", "b": "True"})],
        why="without tool schemas vLLM keeps every qwen3_coder value a string; we decode JSON",
    ),
    Case(
        "unicode",
        "<tool_call>\n<function=traduire>\n<parameter=t>\n日本語 ½ ✓\n</parameter>\n</function>\n"
        "</tool_call>",
        [("traduire", {"t": "日本語 ½ ✓"})],
    ),
]

DS = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
DS_SEP, DS_END, DS_ENDS = "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"
DEEPSEEK_V3 = [
    Case(
        "single",
        f'{DS}function{DS_SEP}f\n```json\n{{"a": 1}}\n```{DS_END}{DS_ENDS}',
        [("f", {"a": 1})],
    ),
    Case(
        "several",
        f'{DS}function{DS_SEP}f\n```json\n{{"a": 1}}\n```{DS_END}\n'
        f"<｜tool▁call▁begin｜>function{DS_SEP}g\n```json\n{{}}\n```{DS_END}{DS_ENDS}",
        [("f", {"a": 1}), ("g", {})],
    ),
    Case(
        "content+call",
        f'Let me check.{DS}function{DS_SEP}f\n```json\n{{"a": 1}}\n```{DS_END}{DS_ENDS}',
        [("f", {"a": 1})],
        content="Let me check.",
    ),
    Case("no call", "The answer is 42.", [], content="The answer is 42."),
    Case(
        "malformed json",
        f'{DS}function{DS_SEP}f\n```json\n{{"a": 1,}}\n```{DS_END}{DS_ENDS}',
        [],
        errors=True,
        vllm_errors=True,  # vLLM returns the call with arguments '{"a": 1,}'; adapter rejects it
    ),
    Case(
        "V3.1 short form",
        f'{DS}f{DS_SEP}{{"a": 1}}{DS_END}{DS_ENDS}',
        [("f", {"a": 1})],
        vllm_calls=[],
        why="we read DeepSeek V3.1's short form too; vLLM's deepseek_v3 parser reads V3's only",
    ),
    Case(
        "unicode",
        f'Voilà{DS}function{DS_SEP}traduire\n```json\n{{"t": "日本語 ½ ✓"}}\n```{DS_END}{DS_ENDS}',
        [("traduire", {"t": "日本語 ½ ✓"})],
        content="Voilà",
    ),
]

TABLES = {
    "hermes": HERMES,
    "llama3_json": LLAMA3_JSON,
    "mistral": MISTRAL,
    "mistral-v11": MISTRAL_V11,
    "pythonic": PYTHONIC,
    "qwen3_coder": QWEN3_CODER,
    "deepseek_v3": DEEPSEEK_V3,
}
PARAMS = [
    pytest.param(table, case, id=f"{table}-{case.id}")
    for table, cases in TABLES.items()
    for case in cases
]

_VLLM_PARSERS: dict[str, ToolCallParser] = {}


def _vllm_parser(name: str, kwargs: dict) -> ToolCallParser:
    require("vllm")
    key = f"{name}{sorted(kwargs.items())}"
    if key not in _VLLM_PARSERS:
        _VLLM_PARSERS[key] = get_parser(f"vllm:{name}", **kwargs)
    return _VLLM_PARSERS[key]


def _calls(turn: ParsedTurn) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in turn.tool_calls]


@pytest.mark.parametrize(("table", "case"), PARAMS)
def test_ours_vs_vllm(table: str, case: Case) -> None:
    name = table.removesuffix("-v11")
    ours = get_parser(name).parse(case.text)
    theirs = _vllm_parser(name, case.vllm_kwargs).parse(case.text)

    assert _calls(ours) == case.calls
    assert ours.content == case.content
    assert bool(ours.errors) == case.errors, ours.errors

    expected_calls = case.calls if case.vllm_calls is SAME else case.vllm_calls
    expected_content = {SAME: case.content, RAW: case.text}.get(
        case.vllm_content, case.vllm_content
    )
    assert _calls(theirs) == expected_calls
    assert theirs.content.strip() == expected_content.strip()
    assert bool(theirs.errors) == case.vllm_errors, theirs.errors

    differs = _calls(theirs) != _calls(ours) or theirs.content.strip() != ours.content
    assert case.why or not differs, "a difference from vLLM needs a documented reason"


def test_every_difference_is_documented() -> None:
    from pathlib import Path

    doc = " ".join((Path(__file__).parents[2] / "docs" / "parsers.md").read_text().split())
    reasons = {c.why for cases in TABLES.values() for c in cases if c.why}
    for reason in reasons:
        assert reason.lower() in doc.lower(), f"docs/parsers.md does not explain: {reason}"


@pytest.mark.parametrize(
    "name",
    ["hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder", "deepseek_v3", "deepseek_v31"],
)
def test_vllm_parses_what_we_render(name: str) -> None:
    """Text our `render` writes is read the same by vLLM's parser (no content: vLLM's llama3
    and pythonic parsers drop or reject text around the calls), escaped markers included."""
    from agentgym.parsers import ToolCall

    markers = "</tool_call> [TOOL_CALLS] <|python_tag|>"
    calls = [ToolCall("f", {"a": 1, "s": f"é ✓ {markers}"}), ToolCall("g", {})]
    tools = [_schema("f", {"a": "integer", "s": "string"}), _schema("g", {})]
    text = get_parser(name).for_tools(tools).render("", calls)
    theirs = _vllm_parser(name, {"tools": tools})  # vLLM's qwen3_coder types values by them
    assert _calls(theirs.parse(text)) == [(c.name, c.arguments) for c in calls]


def _schema(name: str, types: dict[str, str]) -> dict[str, Any]:
    properties = {key: {"type": kind} for key, kind in types.items()}
    parameters = {"type": "object", "properties": properties}
    return {
        "type": "function",
        "function": {"name": name, "description": "d", "parameters": parameters},
    }


def test_vllm_adapter_render_and_errors() -> None:
    from agentgym._errors import ConfigError
    from agentgym.parsers import ToolCall

    v11 = _vllm_parser("mistral", V11)
    text = v11.render("", [ToolCall("f", {"a": 1})])
    assert text == '[TOOL_CALLS]f[ARGS]{"a": 1}'
    assert _calls(v11.parse(text)) == [("f", {"a": 1})]
    with pytest.raises(NotImplementedError, match="only parse"):
        get_parser("vllm:internlm").render("", [ToolCall("f", {})])
    with pytest.raises(ConfigError, match="Did you mean 'vllm:hermes'"):
        get_parser("vllm:hermess")


def test_vllm_openai_parses_gpt_oss_harmony_and_says_it_cannot_render() -> None:
    from agentgym.parsers import ToolCall

    harmony = _vllm_parser("openai", {})
    call = (
        "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.calculate <|constrain|>json<|message|>{"expression": "1+2"}<|call|>'
    )
    assert _calls(harmony.parse(call)) == [("calculate", {"expression": "1+2"})]
    answer = harmony.parse("<|channel|>final<|message|>It is 3.<|return|>")
    assert (answer.content, answer.tool_calls, answer.errors) == ("It is 3.", [], [])
    cut = harmony.parse(call[:-12])  # cut inside the arguments
    assert cut.tool_calls == [] and cut.errors
    with pytest.raises(NotImplementedError, match="cannot be rendered"):
        harmony.render("", [ToolCall("f", {})])


def test_a_vllm_parser_missing_its_markers_is_one_line_naming_the_fix() -> None:
    from agentgym._errors import ConfigError
    from agentgym.engine.tiny import make_tokenizer

    require("vllm")
    with pytest.raises(ConfigError, match=r"pass the model's tokenizer") as info:
        get_parser("vllm:deepseek_v3", tokenizer=make_tokenizer())
    assert "\n" not in str(info.value) and "check --model DIR" in str(info.value)
    # the default tokenizer carries DeepSeek's markers: no tokenizer needed
    assert get_parser("vllm:deepseek_v3").name == "vllm:deepseek_v3"
