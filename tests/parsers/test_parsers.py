"""Our tool-call parsers: round trips, malformed input, registry; table-driven over all parsers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentgym._errors import ConfigError
from agentgym.parsers import ParsedTurn, ToolCall, ToolCallParser, available_parsers, get_parser

# Every parser and render style: (id, name, constructor kwargs).
PARSERS = [
    ("hermes", "hermes", {}),
    ("llama3_json", "llama3_json", {}),
    ("llama3_json-python_tag", "llama3_json", {"python_tag": True}),
    ("mistral-json", "mistral", {}),
    ("mistral-args", "mistral", {"style": "args"}),
    ("pythonic", "pythonic", {}),
    ("qwen3_coder", "qwen3_coder", {}),
    ("deepseek_v3", "deepseek_v3", {}),
    ("deepseek_v31", "deepseek_v31", {}),
]
#: Parsers whose format cannot carry markup characters in argument names.
PLAIN_KEYS_ONLY = {"pythonic", "qwen3_coder"}


@pytest.fixture(params=PARSERS, ids=[p[0] for p in PARSERS])
def parser(request: pytest.FixtureRequest) -> ToolCallParser:
    _, name, kwargs = request.param
    return get_parser(name, **kwargs)


TURNS = {
    "single": ("", [ToolCall("calculate", {"expression": "37 * 48"})]),
    "several": ("", [ToolCall("f", {"a": 1}), ToolCall("g", {}), ToolCall("f", {"a": 2})]),
    "content+call": ("Let me compute that.", [ToolCall("calculate", {"expression": "1+1"})]),
    "multiline content": ("Step 1.\nStep 2.", [ToolCall("search", {"query": "x"})]),
    "unicode": ("Voilà ✓", [ToolCall("translate", {"text": '日本語 — ½ "quoted" \\ \n'})]),
    "nested + types": (
        "",
        [
            ToolCall(
                "configure",
                {
                    "n": -3,
                    "x": 2.5,
                    "flag": True,
                    "off": False,
                    "none": None,
                    "items": [1, "two", [3.0], {"k": "v"}],
                    "obj": {"deep": {"deeper": [True, None]}},
                },
            )
        ],
    ),
    "dotted name": ("", [ToolCall("math.sqrt", {"x": 16})]),
    "no call": ("Just an answer: 42.", []),
}


@pytest.mark.parametrize("case", list(TURNS), ids=list(TURNS))
def test_round_trip(parser: ToolCallParser, case: str) -> None:
    content, calls = TURNS[case]
    text = parser.render(content, calls)
    turn = parser.parse(text)
    assert turn.errors == []
    assert turn.content == content
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        (c.name, c.arguments) for c in calls
    ]


#: Text that means something to one of the formats: call markers, separators, call starts.
MARKERS = [
    "</tool_call>",
    "<tool_call>",
    '<tool_call>{"name": "g", "arguments": {}}</tool_call>',
    "[TOOL_CALLS]",
    '[TOOL_CALLS][{"name": "g", "arguments": {}}]',
    "[ARGS]",
    "<|python_tag|>",
    '\n{"name": "g", "parameters": {}}',
    "; ",
    "\n[g(a=1)]",
    "<\\/tool_call>",
    "</parameter>",
    "\n</parameter>\n</function>\n</tool_call>",
    "<function=g>",
    "True",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁end｜>\n```",
    "<｜tool▁sep｜>",
]


@pytest.mark.parametrize("marker", MARKERS)
def test_markers_inside_argument_values_and_keys_round_trip(
    parser: ToolCallParser, marker: str
) -> None:
    calls = [
        ToolCall("f", {"text": f"a{marker}b", "items": [marker], "nested": {"k": marker}}),
        ToolCall("g", {f"key{marker}": 1} if parser.name not in PLAIN_KEYS_ONLY else {}),
    ]
    turn = parser.parse(parser.render("Let me check.", calls))
    assert turn.errors == []
    assert turn.content == "Let me check."
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        (c.name, c.arguments) for c in calls
    ]


@pytest.mark.parametrize("marker", MARKERS)
@pytest.mark.parametrize("with_calls", [True, False], ids=["calls", "no-calls"])
def test_content_holding_a_marker_round_trips_or_raises(
    parser: ToolCallParser, marker: str, with_calls: bool
) -> None:
    content = f"I would write {marker}\n{marker.strip()} and go on."
    calls = [ToolCall("f", {"a": 1})] if with_calls else []
    try:
        text = parser.render(content, calls)
    except ValueError as exc:
        assert "would parse as a tool call" in str(exc)
        return
    turn = parser.parse(text)
    assert (turn.content, turn.errors) == (content, [])
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        (c.name, c.arguments) for c in calls
    ]


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("hermes", "see <tool_call> here"),
        ("mistral", "see [TOOL_CALLS] here"),
        ("llama3_json", "see <|python_tag|> here"),
        ("llama3_json", 'see\n{"name": "f"} here'),
        ("pythonic", "see\n[f(a=1)]"),
        ("qwen3_coder", "see <tool_call> here"),
        ("qwen3_coder", "see <function=f> here"),
        ("deepseek_v3", "see <｜tool▁calls▁begin｜> here"),
        ("deepseek_v3", "see <｜tool▁call▁begin｜> here"),
        ("deepseek_v31", "see <｜tool▁call▁begin｜> here"),
    ],
)
def test_content_a_format_cannot_express_raises(name: str, content: str) -> None:
    with pytest.raises(ValueError, match="would parse as a tool call"):
        get_parser(name).render(content, [ToolCall("f", {})])


def test_mistral_args_style_refuses_names_it_cannot_carry() -> None:
    with pytest.raises(ValueError, match="tool name"):
        get_parser("mistral", style="args").render("", [ToolCall("my tool", {})])


def test_plain_text_is_content(parser: ToolCallParser) -> None:
    for text in ["", "Hello", "Use {x} here; [a, b] = f(x)", "The set {1, 2}\n[1, 2, 3]"]:
        turn = parser.parse(text)
        assert (turn.content, turn.tool_calls, turn.errors) == (text, [], [])


def test_parse_never_raises_on_truncations(parser: ToolCallParser) -> None:
    """Every prefix of a valid turn (what a model cut off by max_tokens emits) parses."""
    text = parser.render("Thinking.", [ToolCall("f", {"a": [1, {"b": "c"}]}), ToolCall("g", {})])
    for end in range(len(text) + 1):
        turn = parser.parse(text[:end])
        assert isinstance(turn, ParsedTurn)
        for call in turn.tool_calls:
            assert (call.name, call.arguments) in [("f", {"a": [1, {"b": "c"}]}), ("g", {})]
    # The cut-off last call is reported, not silently dropped (cut inside the second call).
    cut = parser.parse(text[: text.rindex("g") + 1])
    assert len(cut.tool_calls) + len(cut.errors) >= 1
    assert [c.name for c in cut.tool_calls] in (["f"], [])


#: DeepSeek V3's markers, for the tables below.
DS, SEP, END = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
)

# (parser name, text, expected good call names, a substring every error message shares)
MALFORMED = [
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}', [], "malformed"),
    ("hermes", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', [], "JSON object"),
    ("hermes", '<tool_call>{"name": 3}</tool_call>', [], "string"),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', [], "name"),
    ("hermes", '<tool_call>{"name": "", "arguments": {}}</tool_call>', [], "non-empty"),
    (
        "hermes",
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call><tool_call>nope</tool_call>',
        ["ok"],
        "nope",
    ),
    ("llama3_json", '{"name": "f", "parameters": {"a": 1}', [], "malformed"),
    ("llama3_json", '{"name": "f", "parameters": "not json"}', [], "malformed"),
    ("llama3_json", '{"name": "f", "parameters": [1, 2]}', [], "JSON object"),
    ("llama3_json", '{"name": "f", "parameters": {}}; oops', ["f"], "unexpected text"),
    (
        "llama3_json",
        '{"name": 5, "parameters": {}}; {"name": "g", "parameters": {}}',
        ["g"],
        "name",
    ),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}', [], "malformed"),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": 7}, {"name": "g"}]', ["g"], "JSON object"),
    ("mistral", "[TOOL_CALLS][1, 2]", [], "JSON object"),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"a": ', [], "arguments of 'f'"),
    ("mistral", "[TOOL_CALLS]f[ARGS]not json", [], "name[ARGS]"),
    ("pythonic", "[f(a=1)", [], "never closed"),
    ("pythonic", "[f(1, 2)]", [], "keyword"),
    ("pythonic", "[f(a=b)]", [], "literals"),
    ("pythonic", "[f(a=open('x').read())]", [], "literals"),
    ("pythonic", "[f(**kw)]", [], "keyword"),
    ("pythonic", "[f(a=1), 3]", [], "calls"),
    ("pythonic", "[f(a={x: 1})]", [], "dict keys"),
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1\n", [], "cut off"),
    ("qwen3_coder", "<tool_call>\nf(a=1)\n</tool_call>", [], "<function=NAME>"),
    ("qwen3_coder", "<tool_call>\n<function=f>\nhello\n</function>", [], "unexpected text"),
    (
        "qwen3_coder",
        "<tool_call><function=ok></function></tool_call><tool_call><function=>",
        ["ok"],
        "<function=NAME>",
    ),
    ("deepseek_v3", f'{DS}function{SEP}f\n```json\n{{"a": 1,}}\n```{END}', [], "malformed"),
    ("deepseek_v3", f"{DS}function{SEP}f\n```json\n[1]\n```{END}", [], "JSON object"),
    ("deepseek_v3", f"{DS}function", [], "no <｜tool▁sep｜>"),
    (
        "deepseek_v3",
        f"{DS}function{SEP}ok\n```json\n{{}}\n```{END}\n<｜tool▁call▁begin｜>function{SEP}g\n```json\n{{",
        ["ok"],
        "malformed",
    ),
]


@pytest.mark.parametrize(("name", "text", "good", "needle"), MALFORMED)
def test_malformed_calls_are_reported(name: str, text: str, good: list[str], needle: str) -> None:
    turn = get_parser(name).parse(text)
    assert [c.name for c in turn.tool_calls] == good
    assert turn.errors, f"{name} accepted {text!r} without an error"
    assert all(needle in e for e in turn.errors), turn.errors


def test_pythonic_parses_without_evaluating(tmp_path) -> None:
    marker = tmp_path / "touched"
    text = f"[f(a=__import__('pathlib').Path({str(marker)!r}).touch())]"
    turn = get_parser("pythonic").parse(text)
    assert turn.tool_calls == [] and turn.errors
    assert not marker.exists()


def test_pythonic_accepts_json_literals_tuples_and_negatives() -> None:
    turn = get_parser("pythonic").parse("[f(a=true, b=null, c=false, d=(1, -2.5), e=+3)]")
    assert turn.errors == []
    assert turn.tool_calls[0].arguments == {
        "a": True,
        "b": None,
        "c": False,
        "d": [1, -2.5],
        "e": 3,
    }


@pytest.mark.parametrize(
    ("call", "needle"),
    [(ToolCall("my-tool", {}), "identifier"), (ToolCall("f", {"not valid": 1}), "identifiers")],
)
def test_pythonic_render_rejects_unrepresentable_calls(call: ToolCall, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        get_parser("pythonic").render("", [call])


@pytest.mark.parametrize(
    ("name", "text", "calls"),
    [
        ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"a": 1}}', [("f", {"a": 1})]),
        ("llama3_json", '{"name": "f", "arguments": {"a": 1}}', [("f", {"a": 1})]),
        ("llama3_json", '{"parameters": {}, "name": "f"}', [("f", {})]),
        ("mistral", '[TOOL_CALLS]{"name": "f", "arguments": "{\\"a\\": 1}"}', [("f", {"a": 1})]),
        ("mistral", '[TOOL_CALLS]f{"a": 1} trailing words', [("f", {"a": 1})]),
        (
            "mistral",
            '[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{"b": 2}',
            [("f", {}), ("g", {"b": 2})],
        ),
        (
            "hermes",
            '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
            [("f", {"a": 1})],
        ),
        ("hermes", '<tool_call>{"name": "f", "arguments": null}</tool_call>', [("f", {})]),
        ("llama3_json", '{"name": "f", "parameters": null}', [("f", {})]),
        (
            "qwen3_coder",
            "<function=f>\n<parameter=a>\n1\n</parameter>\n</function>",
            [("f", {"a": 1})],
        ),
        (
            "qwen3_coder",
            "<tool_call><function=f><parameter=s>x y</parameter><parameter=b>False</parameter>"
            "</function></tool_call>",
            [("f", {"s": "x y", "b": False})],
        ),
        ("deepseek_v3", f'{DS}f{SEP}{{"a": 1}}{END}<｜tool▁calls▁end｜>', [("f", {"a": 1})]),
        (
            "deepseek_v3",
            f'{DS}function{SEP}f\n```json\n{{\n  "a": [1,\n 2]\n}}\n```{END}',
            [("f", {"a": [1, 2]})],
        ),
    ],
)
def test_accepted_variants(name: str, text: str, calls: list[tuple]) -> None:
    turn = get_parser(name).parse(text)
    assert turn.errors == []
    assert [(c.name, c.arguments) for c in turn.tool_calls] == calls


def test_deepseek_v31_writes_v31s_short_form_and_reads_v3s_too() -> None:
    """V3.1's template writes ``NAME<sep>{json}``, calls back to back: what the env renders
    (reference turns, SFT traces) must be what the template writes."""
    v31 = get_parser("deepseek_v31")
    text = v31.render("Hi", [ToolCall("f", {"a": "é"}), ToolCall("g", {})])
    assert text == (f'Hi{DS}f{SEP}{{"a": "é"}}{END}<｜tool▁call▁begin｜>g{SEP}{{}}{END}'
                    "<｜tool▁calls▁end｜>")  # fmt: skip
    v3_text = get_parser("deepseek_v3").render("Hi", [ToolCall("f", {"a": 1})])
    assert [(c.name, c.arguments) for c in v31.parse(v3_text).tool_calls] == [("f", {"a": 1})]
    with pytest.raises(ValueError, match="deepseek_v31 cannot render tool name"):
        v31.render("", [ToolCall(" f", {})])


def test_registry_lists_all_parsers() -> None:
    expected = {"deepseek_v3", "deepseek_v31", "hermes", "llama3_json", "mistral", "pythonic",
                "qwen3_coder"}  # fmt: skip
    assert expected <= set(available_parsers())
    for name in available_parsers():
        assert get_parser(name).name == name


def test_unknown_parser_suggests_a_fix() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'pythonic'"):
        get_parser("pythonik")


def test_bad_mistral_style_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'json' or 'args'"):
        get_parser("mistral", style="xml")


def test_importing_parsers_does_not_import_vllm_or_torch() -> None:
    code = (
        "import sys, agentgym.parsers, agentgym.engine.tiny; "
        "bad = [m for m in ('vllm', 'torch', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_vllm_prefix_without_vllm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm.tool_parsers", None)  # makes the import fail
    with pytest.raises(ConfigError, match=r"pip install 'agentgym\[vllm\]'") as info:
        get_parser("vllm:hermes")
    assert "\n" not in str(info.value)


# ---- formats with more to them than a round trip ----------------------------------------
STRING_AND_NUMBER = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "description": "d",
            "parameters": {
                "type": "object",
                "properties": {"s": {"type": "string"}, "n": {"type": "integer"}},
            },
        },
    }
]


def test_qwen3_coder_types_values_by_the_tool_schema() -> None:
    """The XML carries no types: the schema tells the string "42" from the number 42."""
    text = "<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n"
    text += "<parameter=n>\n42\n</parameter>\n</function>\n</tool_call>"
    typed = get_parser("qwen3_coder").for_tools(STRING_AND_NUMBER)
    assert typed.parse(text).tool_calls[0].arguments == {"s": "42", "n": 42}
    assert get_parser("qwen3_coder").parse(text).tool_calls[0].arguments == {"s": 42, "n": 42}
    call = ToolCall("f", {"s": "42", "n": 42})
    # with the schema, written as the template writes it; without, quoted so it reads back
    assert typed.render("", [call]) == text
    untyped = get_parser("qwen3_coder").render("", [call])
    assert '\n"42"\n' in untyped
    assert get_parser("qwen3_coder").parse(untyped).tool_calls[0].arguments == call.arguments


def test_qwen3_coder_refuses_what_a_string_parameter_cannot_hold() -> None:
    typed = get_parser("qwen3_coder").for_tools(STRING_AND_NUMBER)
    with pytest.raises(ValueError, match="read back"):
        typed.render("", [ToolCall("f", {"s": 42})])
    with pytest.raises(ValueError, match="parameter"):
        get_parser("qwen3_coder").render("", [ToolCall("f", {"a>b": 1})])


def test_mistral_keeps_the_models_call_id_and_always_writes_one() -> None:
    mistral = get_parser("mistral")
    text = '[TOOL_CALLS] [{"name": "f", "arguments": {}, "id": "aB3dE6gH9"}]'
    assert [c.id for c in mistral.parse(text).tool_calls] == ["aB3dE6gH9"]
    # an id of another shape would make the template refuse the conversation: dropped
    assert mistral.parse(text.replace("aB3dE6gH9", "call_1")).tool_calls[0].id == ""
    assert mistral.render("", [ToolCall("f", {}, "aB3dE6gH9")]) == text
    written = mistral.render("", [ToolCall("f", {}), ToolCall("f", {})])
    ids = [c.id for c in mistral.parse(written).tool_calls]
    assert len(set(ids)) == 2 and all(len(i) == 9 and i.isalnum() for i in ids)
    assert ids == [
        c.id for c in mistral.parse(mistral.render("", [ToolCall("f", {})] * 2)).tool_calls
    ]


def test_call_ids_the_env_assigns_fit_the_format() -> None:
    assert get_parser("hermes").make_call_id(2, 1) == "call_2_1"
    mistral = get_parser("mistral")
    ids = {mistral.make_call_id(turn, i) for turn in range(1, 30) for i in range(4)}
    assert len(ids) == 29 * 4
    assert all(len(i) == 9 and i.isalnum() for i in ids)
