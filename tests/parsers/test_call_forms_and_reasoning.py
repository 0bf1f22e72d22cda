"""Probe 55's parser findings: each case was silent (a call dropped, the turn taken as the final
answer, or a valid call refused) before its fix.

1. a ``</think>`` inside a call's arguments cut the call in half and dropped the turn's calls;
2. a call inside an opening ``<think>`` block never closed (max_tokens hit) was run;
3. qwen3_coder decoded digits for a ``str | None`` parameter as an int;
4. llama3_json ``{"type": "function", ...}`` and lists of calls, and Llama 4's
   ``<|python_start|>[...]<|python_end|>``, were read as plain content;
5. hermes/mistral arguments under ``"parameters"`` were dropped (the call ran with ``{}``);
6. every parse error was its own tool message, uncapped;
7. a bare call marker with nothing after it was a final answer;
8. ``agentgym check`` passed ``{"enable_thinking": "false"}``, a string the template reads as true.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentgym import ToolCall, ToolEnv, get_parser, tool
from agentgym._check_template import unread_template_kwargs
from agentgym.parsers import ParsedTurn
from tests.conftest import require

TASKS = [{"prompt": "What is 2 + 3?", "answer": "5"}]
DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"


@tool
def echo(text: str) -> str:
    """Echo the text.

    Args:
        text: what to echo.
    """
    return f"echo:{text}"


def _step(reply: str, parser: str = "hermes", **kwargs: Any) -> tuple[list[dict], bool, dict]:
    env = ToolEnv([echo], tasks=TASKS, parser=parser, **kwargs)
    env.reset(options={"task": 0})
    messages, _, terminated, _, info = env.step(reply)
    return messages, terminated, info


def _calls(turn: ParsedTurn) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in turn.tool_calls]


# ---- 1. a </think> inside a call --------------------------------------------------------------
HERMES_ECHO = '<tool_call>{"name": "echo", "arguments": {"text": "a </think> b"}}</tool_call>'
QWEN3_ECHO = (
    "Echoing.\n<tool_call>\n<function=echo>\n<parameter=text>\na # </think> b\n</parameter>\n"
    "</function>\n</tool_call>"
)


@pytest.mark.parametrize(
    ("reply", "parser", "result"),
    [
        (HERMES_ECHO, "hermes", "echo:a </think> b"),
        (QWEN3_ECHO, "qwen3_coder", "echo:a # </think> b"),
        # a real reasoning block first: the </think> in the argument is not the one that counts
        (f"<think>I will echo.</think>\n{HERMES_ECHO}", "hermes", "echo:a </think> b"),
        # an opening block whose only </think> is inside a call in it: reasoning to the end
        (f"<think>Maybe {HERMES_ECHO}", "hermes", None),
    ],
)
def test_a_think_close_inside_a_call_is_part_of_the_call(
    reply: str, parser: str, result: str | None
) -> None:
    # before: the first </think> anywhere ended the reasoning, the call cut in half gave an
    # error, and the turn became the final answer with no error (the reward read '"}}</tool_call>')
    messages, terminated, info = _step(reply, parser)
    tool_results = [m["content"] for m in messages if m["role"] == "tool"]
    assert tool_results == ([] if result is None else [result])
    assert terminated is (result is None)
    assert info["tool_errors"] == []


def test_a_think_close_outside_the_calls_still_ends_the_reasoning() -> None:
    # documented: calls before the </think> of a block the template opened are reasoning
    call = '<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>'
    messages, terminated, _ = _step(f"I could {call}</think>\n\nIt is 5.")
    assert terminated and [m["role"] for m in messages] == ["assistant"]


# ---- 2. an unclosed opening <think> ------------------------------------------------------------
@pytest.mark.parametrize(
    "reply",
    [
        '<think>Let me try <tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>',
        '<think>Let me try <tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call> '
        "and then I will",
        '\n<think>\n<tool_call>{"name": "echo", "arguments": {"text": "x"}}',
    ],
)
def test_a_call_inside_an_unclosed_opening_think_block_is_not_run(reply: str) -> None:
    # vLLM's reasoning parsers return such a reply as reasoning only; before, the call ran
    messages, terminated, _ = _step(reply)
    assert [m["role"] for m in messages] == ["assistant"]
    assert terminated
    assert messages[0]["content"] == reply.strip() and "tool_calls" not in messages[0]


# ---- 3. qwen3_coder: a parameter whose schema allows a string stays text -----------------------
def _schema(spec: dict[str, Any]) -> list[dict[str, Any]]:
    parameters = {"type": "object", "properties": {"code": spec}}
    return [{"type": "function", "function": {"name": "lookup", "parameters": parameters}}]


QWEN3_LOOKUP = (
    "<tool_call>\n<function=lookup>\n<parameter=code>\n{value}\n</parameter>\n</function>\n"
    "</tool_call>"
)
STRING_SPECS = [
    {"type": "string"},
    {"type": ["string", "null"]},
    {"anyOf": [{"type": "string"}, {"type": "null"}]},
    {"oneOf": [{"type": "integer"}, {"type": "string"}]},
]


@pytest.mark.parametrize("spec", STRING_SPECS)
@pytest.mark.parametrize("value", ["12345", "true", "[1]", "None"])
def test_qwen3_coder_parameters_that_allow_a_string_stay_text(spec: dict, value: str) -> None:
    parser = get_parser("qwen3_coder").for_tools(_schema(spec))
    assert _calls(parser.parse(QWEN3_LOOKUP.format(value=value))) == [("lookup", {"code": value})]


def test_qwen3_coder_parameters_that_allow_no_string_are_still_decoded() -> None:
    parser = get_parser("qwen3_coder").for_tools(_schema({"anyOf": [{"type": "integer"}]}))
    assert _calls(parser.parse(QWEN3_LOOKUP.format(value="12345"))) == [
        ("lookup", {"code": 12345})
    ]


def test_an_optional_string_tool_parameter_gets_digits_as_text_in_the_env() -> None:
    @tool
    def lookup(code: str | None = None) -> str:
        """Look a code up.

        Args:
            code: the code, as text.
        """
        return f"code={code!r}"

    env = ToolEnv([lookup], tasks=TASKS, parser="qwen3_coder")
    env.reset(options={"task": 0})
    messages, *_ = env.step(QWEN3_LOOKUP.format(value="12345"))
    assert messages[-1]["content"] == "code='12345'"


# ---- 4. llama3_json and Llama 4 pythonic forms that vLLM reads as calls -------------------------
@pytest.mark.parametrize(
    ("text", "calls", "content"),
    [
        ('{"type": "function", "name": "f", "parameters": {"a": 1}}', [("f", {"a": 1})], ""),
        ('{"a": 0, "name": "f", "arguments": {"a": 1}}', [("f", {"a": 1})], ""),
        ('[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]',
         [("f", {"a": 1}), ("g", {})], ""),  # fmt: skip
        ('Sure.\n[{"name": "f", "parameters": {"a": 1}}]', [("f", {"a": 1})], "Sure."),
        ('<|python_tag|>[{"name": "f", "parameters": {"a": 1}}]', [("f", {"a": 1})], ""),
        # JSON that is not a call stays content
        ('{"age": 3, "name": "Alice"}', [], '{"age": 3, "name": "Alice"}'),  # no arguments key
        ('{"type": "object", "properties": {}}', [], '{"type": "object", "properties": {}}'),
        ("[1, 2, 3]", [], "[1, 2, 3]"),
    ],
)
def test_llama3_json_reads_calls_as_vllm_does(text: str, calls: list, content: str) -> None:
    turn = get_parser("llama3_json").parse(text)
    assert (_calls(turn), turn.content, turn.errors) == (calls, content, [])


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ('<|python_start|>[f(a=1, b="x")]<|python_end|>', ""),
        ('<|python_start|>[f(a=1, b="x")]', ""),  # cut before <|python_end|>
        ('Let me look.<|python_start|>[f(a=1, b="x")]<|python_end|>', "Let me look."),
        ('[f(a=1, b="x")]<|python_end|>', ""),
    ],
)
def test_pythonic_reads_llama4_python_start_and_end(text: str, content: str) -> None:
    turn = get_parser("pythonic").parse(text)
    assert (_calls(turn), turn.content, turn.errors) == ([("f", {"a": 1, "b": "x"})], content, [])


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("llama3_json", '{"type": "function", "name": "f", "parameters": {}}'),
        ("llama3_json", 'See:\n[{"name": "f", "arguments": {}}]'),
        ("pythonic", "Then <|python_start|>"),
    ],
)
def test_render_refuses_content_that_now_reads_as_a_call(name: str, content: str) -> None:
    with pytest.raises(ValueError, match="would parse as a tool call"):
        get_parser(name).render(content, [ToolCall("g", {})])


def test_the_new_forms_run_in_the_env() -> None:
    for parser, reply in [
        ("llama3_json", '{"type": "function", "name": "echo", "parameters": {"text": "x"}}'),
        ("llama3_json", '[{"name": "echo", "parameters": {"text": "x"}}]'),
        ("pythonic", '<|python_start|>[echo(text="x")]<|python_end|>'),
    ]:
        messages, terminated, _ = _step(reply, parser)
        assert not terminated and messages[-1]["content"] == "echo:x", (parser, reply)


# ---- 5. arguments under a key the format does not read -----------------------------------------
@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", '<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>'),
        ("mistral", '[TOOL_CALLS] [{"name": "f", "parameters": {"a": 1}}]'),
        ("mistral", '[TOOL_CALLS]{"name": "f", "parameters": {"a": 1}}'),
    ],
)
def test_arguments_under_parameters_are_an_error_naming_arguments(name: str, text: str) -> None:
    # before: the call ran with {} and the model was told a required argument was missing
    turn = get_parser(name).parse(text)
    assert turn.tool_calls == []
    assert len(turn.errors) == 1 and "put the arguments under 'arguments'" in turn.errors[0]


def test_llama3_json_refuses_parameters_and_arguments_that_differ() -> None:
    parser = get_parser("llama3_json")
    turn = parser.parse('{"name": "f", "parameters": {"a": 1}, "arguments": {"a": 2}}')
    assert turn.tool_calls == [] and "different values" in turn.errors[0]
    same = parser.parse('{"name": "f", "parameters": {"a": 1}, "arguments": {"a": 1}}')
    assert _calls(same) == [("f", {"a": 1})] and same.errors == []


def test_hermes_parameters_beside_arguments_is_ignored_as_vllm_ignores_it() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"a": 1}, "parameters": {"a": 2}}</tool_call>'
    turn = get_parser("hermes").parse(text)
    assert (_calls(turn), turn.errors) == ([("f", {"a": 1})], [])


def test_a_parameters_call_reaches_the_model_as_one_line_error() -> None:
    messages, terminated, info = _step(
        '<tool_call>{"name": "echo", "parameters": {"text": "x"}}</tool_call>'
    )
    assert not terminated and len(info["tool_errors"]) == 1
    assert "'arguments'" in messages[-1]["content"] and "\n" not in messages[-1]["content"]


# ---- 6. parse errors are capped per turn ---------------------------------------------------------
@pytest.mark.parametrize(("cap", "shown"), [(None, 40), (16, 16), (2, 2), (1, 1)])
def test_parse_errors_of_one_turn_are_capped(cap: int | None, shown: int) -> None:
    messages, terminated, info = _step(
        "<tool_call></tool_call>" * 40, max_tool_calls_per_turn=cap, max_tool_result_chars=300
    )
    tools = [m for m in messages if m["role"] == "tool"]
    assert not terminated and len(tools) == shown == len(info["tool_errors"])
    assert all(len(m["content"]) < 400 for m in tools)
    if cap is not None:
        assert f"and {40 - shown} more" in tools[-1]["content"]
        assert "this turn had 40 malformed tool calls" in tools[-1]["content"]


def test_parse_errors_beside_calls_at_the_cap_collapse_into_one_message() -> None:
    call = '<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>'
    messages, _, info = _step(call * 2 + "<tool_call>{bad</tool_call>" * 5,
                              max_tool_calls_per_turn=2)  # fmt: skip
    tools = [m["content"] for m in messages if m["role"] == "tool"]
    assert tools[:2] == ["echo:x", "echo:x"]
    assert len(tools) == 3 and "and 4 more" in tools[2]


def test_a_few_parse_errors_each_keep_their_own_message() -> None:
    messages, _, info = _step("<tool_call>{bad</tool_call>" * 3)
    assert [m["name"] for m in messages[1:]] == ["invalid_tool_call"] * 3
    assert len(info["tool_errors"]) == 3 and "more" not in messages[-1]["content"]


# ---- 7. a bare call marker ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "text", "content"),
    [
        ("mistral", "[TOOL_CALLS]", ""),
        ("mistral", "Checking.[TOOL_CALLS]  ", "Checking."),
        ("mistral", "[TOOL_CALLS] []", ""),
        ("llama3_json", "<|python_tag|>", ""),
        ("llama3_json", "The answer is 4.\n<|python_tag|>", "The answer is 4."),
        ("deepseek_v3", DS_CALLS, ""),
        ("deepseek_v3", f"Checking.{DS_CALLS}{DS_CALLS_END}", "Checking."),
        ("deepseek_v31", DS_CALLS, ""),
        ("pythonic", "<|python_start|>", ""),
        ("pythonic", "<|python_start|><|python_end|>", ""),
    ],
)
def test_a_bare_call_marker_is_an_error(name: str, text: str, content: str) -> None:
    turn = get_parser(name).parse(text)
    assert (turn.tool_calls, turn.content) == ([], content)
    assert len(turn.errors) == 1 and "with no call after it" in turn.errors[0]


def test_a_bare_call_marker_does_not_end_the_episode() -> None:
    messages, terminated, info = _step("[TOOL_CALLS]", "mistral")
    assert not terminated and info["tool_errors"] == ["[TOOL_CALLS] with no call after it"]
    assert messages[-1]["name"] == "invalid_tool_call"


# ---- 8. chat-template kwargs: a boolean quoted as a string ---------------------------------------
class _Tokenizer:
    chat_template = (
        "{% if enable_thinking is defined and enable_thinking is false %}off{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )


@pytest.mark.parametrize("value", ["false", "False", "true", " TRUE "])
def test_a_template_kwarg_boolean_quoted_as_a_string_is_refused(value: str) -> None:
    problem = unread_template_kwargs(_Tokenizer(), {"enable_thinking": value})
    assert "is a string" in problem and "\n" not in problem
    assert f'"enable_thinking": {value.strip().lower()}' in problem


@pytest.mark.parametrize("value", [False, True, "auto", 0])
def test_other_template_kwarg_values_pass(value: Any) -> None:
    assert unread_template_kwargs(_Tokenizer(), {"enable_thinking": value}) == ""


def test_check_fails_the_kwargs_row_for_a_quoted_boolean() -> None:
    from agentgym._check_template import _template_kwargs

    row = _template_kwargs(_Tokenizer(), {"enable_thinking": "false"})
    assert not row.passed and "pass the JSON boolean" in row.detail


# ---- vLLM agrees where these fixes say it does ---------------------------------------------------
@pytest.mark.vllm
@pytest.mark.parametrize(
    ("ours", "theirs", "text"),
    [
        ("llama3_json", "llama3_json", '{"type": "function", "name": "f", "parameters": {"a": 1}}'),
        ("llama3_json", "llama3_json",
         '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]'),
        ("llama3_json", "llama3_json", '<|python_tag|>[{"name": "f", "parameters": {"a": 1}}]'),
        ("pythonic", "llama4_pythonic", "<|python_start|>[f(a=1)]<|python_end|>"),
        ("pythonic", "llama4_pythonic", "<|python_start|>[f(a=1)]"),
    ],  # fmt: skip
)
def test_vllm_reads_the_same_calls(ours: str, theirs: str, text: str) -> None:
    require("vllm")
    assert _calls(get_parser(ours).parse(text)) == _calls(get_parser(f"vllm:{theirs}").parse(text))


@pytest.mark.vllm
@pytest.mark.parametrize("spec", STRING_SPECS[:3])
def test_vllm_qwen3_coder_keeps_optional_string_parameters_text(spec: dict) -> None:
    require("vllm")
    text = QWEN3_LOOKUP.format(value="12345")
    ours = get_parser("qwen3_coder").for_tools(_schema(spec)).parse(text)
    theirs = get_parser("vllm:qwen3_coder", tools=_schema(spec)).parse(text)
    assert _calls(ours) == _calls(theirs) == [("lookup", {"code": "12345"})]


@pytest.mark.parametrize(
    "text",
    ["{,\n" * 33000, "{\n" * 50000, '{"a": 1,\n' * 10000, '{"a": [\n' * 12000, "[\n" * 40000],
)
def test_llama3_json_line_start_json_stays_linear(text: str) -> None:
    # each line-start JSON is decoded to see whether it is a call: a failed decode's error
    # counted the lines before it, and these 100 KB took 1-5 s
    import time

    began = time.perf_counter()
    turn = get_parser("llama3_json").parse(text)
    assert time.perf_counter() - began < 0.5
    assert (turn.tool_calls, turn.errors) == ([], [])


# ---- the parses a reply costs -------------------------------------------------------------------
ECHO_CALL = '<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>'


@pytest.mark.parametrize(
    ("reply", "parses"),
    [
        (ECHO_CALL, 1),
        ("It is 5.", 1),
        (f"<think>x</think>\n{ECHO_CALL}", 2),  # the whole reply, the text before </think>
        (f"<think>I could {ECHO_CALL}</think>\nIt is 5.", 3),  # and the answer after it
        (f"<think>Let me try {ECHO_CALL}", 1),  # never closed: not parsed again
        (f"<think>Maybe {HERMES_ECHO}", 2),  # its only </think> is inside the call
    ],
)
def test_a_reply_costs_one_parse_and_one_per_think_close_tried(reply: str, parses: int) -> None:
    # before: 4 parses for a reasoning turn and 3 for an unclosed <think>, on every step
    env = ToolEnv([echo], tasks=TASKS, parser="hermes")
    env.reset(options={"task": 0})
    parse, texts = env.parser.parse, []

    def counted(text: str) -> ParsedTurn:
        texts.append(text)
        return parse(text)

    env.parser.parse = counted  # type: ignore[method-assign]
    env.step(reply)
    assert len(texts) == parses, texts
