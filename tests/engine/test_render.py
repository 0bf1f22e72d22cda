"""ChatRenderer: prompt deltas and the concat/per_turn decision, on small templates written here
that reproduce real families' behaviour (ChatML keeps history; Qwen3 drops old reasoning;
Mistral v0.3 moves the system prompt; Hermes-3 renders the last tool message differently)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentgym import ConfigError
from agentgym.engine import ChatRenderer, TemplateError
from agentgym.engine._episode import probe_conversation
from agentgym.engine.tiny import make_tokenizer
from tests.conftest import CALCULATE_TOOL

TOOLS = [CALCULATE_TOOL]

# Qwen3-like: reasoning of assistant turns before the last user message is dropped.
DROPS_THINK = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{%- set c = m.content %}"
    "{%- if not loop.last and '</think>' in c %}{%- set c = c.split('</think>')[-1] %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + c + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Mistral-v0.3-like: the system prompt is shown only in front of the last user message.
MOVES_SYSTEM = (
    "{%- set sys = messages[0].content if messages[0].role == 'system' else '' %}"
    "{%- set ns = namespace(last_user=0) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + (sys + '\\n' if loop.index0 == ns.last_user else '')"
    " + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role != 'system' %}"
    "{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Hermes-3-like: the newline after a tool message's end only when another message follows.
LAST_TOOL_DIFFERS = (
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{{- '<|im_start|>tool\\n' + m.content + '<|im_end|>' + ('' if loop.last else '\\n') }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def renderer(template: str | None = None) -> ChatRenderer:
    tok = make_tokenizer()
    if template is not None:
        tok.chat_template = template
    return ChatRenderer(tok)


def test_chatml_with_tools_is_concat_and_deltas_rebuild_a_fresh_render() -> None:
    r = renderer()
    conversation = probe_conversation(TOOLS)
    decision = r.decide_mode(conversation, TOOLS)
    assert decision.mode == "concat", decision.reason

    # as the engine does it: the first prompt, then sampled ids + delta, turn after turn
    ids = r.prompt_ids(conversation[:2], TOOLS)
    sampled = r.encode("<tool_call>\nx\n</tool_call><|im_end|>")
    history = [*conversation[:2], {"role": "assistant", "content": "<tool_call>\nx\n</tool_call>"}]
    tool = {"role": "tool", "tool_call_id": "c", "name": "calculate", "content": "4"}
    ids += sampled + r.delta_ids(history, [tool], TOOLS, sampled)
    assert ids == r.prompt_ids([*history, tool], TOOLS)


def test_a_turn_cut_by_length_gets_its_turn_end_as_env_tokens() -> None:
    r = renderer()
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "abc"}]
    nudge = {"role": "user", "content": "go on"}
    delta = r.delta_ids(history, [nudge], None, r.encode("abc"))  # no <|im_end|> sampled
    assert r.tokenizer.decode(delta).startswith("<|im_end|>\n<|im_start|>user\ngo on")
    stopped = r.delta_ids(history, [nudge], None, r.encode("abc<|im_end|>"))
    assert r.tokenizer.decode(stopped).startswith("\n<|im_start|>user")


def test_a_turn_ended_by_another_eos_keeps_it_and_gets_the_whole_turn_end() -> None:
    """Qwen2.5's generation_config also stops on <|endoftext|>: the episode stays concat (a
    model could otherwise push any episode to per_turn, and a run set to concat would stop)."""
    r = renderer()
    r.stop_token_ids = r.stop_token_ids | {r.tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "abc"}]
    nudge = {"role": "user", "content": "go on"}
    delta = r.delta_ids(history, [nudge], None, r.encode("abc<|endoftext|>"))
    assert delta is not None
    assert r.tokenizer.decode(delta).startswith("<|im_end|>\n<|im_start|>user\ngo on")


@pytest.mark.parametrize(
    ("template", "conversation", "why"),
    [
        (
            DROPS_THINK,
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "<think>hmm</think>call"},
                {"role": "user", "content": "result"},
                {"role": "assistant", "content": "<think>ok</think>done"},
            ],
            "rewrites assistant turn 1",
        ),
        (
            MOVES_SYSTEM,
            [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "call"},
                {"role": "user", "content": "result"},
                {"role": "assistant", "content": "done"},
            ],
            "rewrites assistant turn 1",
        ),
        (
            LAST_TOOL_DIFFERS,
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "call 1"},
                {"role": "tool", "content": "r1"},
                {"role": "assistant", "content": "call 2"},
                {"role": "tool", "content": "r2"},
                {"role": "assistant", "content": "done"},
            ],
            "prompt of assistant turn 2 changes",
        ),
    ],
    ids=["drops-reasoning", "moves-system-prompt", "last-tool-message-differs"],
)
def test_templates_that_rewrite_history_get_per_turn_with_a_reason(
    template: str, conversation: list[dict], why: str
) -> None:
    decision = renderer(template).decide_mode(conversation, None)
    assert decision.mode == "per_turn"
    assert why in decision.reason


def test_template_kwargs_reach_the_template() -> None:
    tok = make_tokenizer()
    tok.chat_template = (
        "{%- for m in messages %}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if not enable_thinking %}{{- '<think></think>' }}{%- endif %}{%- endif %}"
    )
    on = ChatRenderer(tok, {"enable_thinking": True})
    off = ChatRenderer(tok, {"enable_thinking": False})
    messages = [{"role": "user", "content": "q"}]
    assert off.render_text(messages, None, True) == on.render_text(messages, None, True) + (
        "<think></think>"
    )


def test_missing_or_broken_template_is_a_clear_error() -> None:
    tok = make_tokenizer()
    tok.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        ChatRenderer(tok)
    with pytest.raises(TemplateError, match="failed to render"):
        renderer("{{ raise_exception('no tools here') }}")


def test_a_tokenizer_without_its_vocabulary_is_refused_naming_the_files(tmp_path: Path) -> None:
    # tokenizer_config.json alone (a common partial copy) loads, and encodes text to no ids
    make_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    vocabless = AutoTokenizer.from_pretrained(tmp_path)
    assert vocabless.encode("The answer is 42.") == []  # what every template check would see
    with pytest.raises(ConfigError, match=r"vocabulary is missing; use .*tokenizer\.json"):
        ChatRenderer(vocabless)


def test_a_template_that_wants_arguments_as_text_gets_json_text() -> None:
    # DeepSeek-V3-like: the arguments are concatenated into the prompt as a string
    r = renderer(
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') }}"
        "{%- for c in (m.tool_calls or []) %}{{- c.function.name + ' ' + c.function.arguments }}"
        "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endfor %}"
    )
    call = {"id": "c1", "type": "function",
            "function": {"name": "calculate", "arguments": {"expression": "1 + 2 é"}}}  # fmt: skip
    text = r.render_text([{"role": "assistant", "content": "", "tool_calls": [call]}], None, False)
    assert 'calculate {"expression": "1 + 2 é"}' in text  # as the parsers write it, not \u00e9


def _base_model_tokenizer(folder: Path, generation_eos: list[str]) -> object:
    """The tiny tokenizer as a base model ships it: eos ``<|endoftext|>`` under a ChatML
    template that ends turns with ``<|im_end|>`` (Qwen2.5 base), its generation_config.json
    stopping on ``generation_eos`` (Gemma's lists its turn end beside its eos)."""
    tok = make_tokenizer()
    tok.eos_token = "<|endoftext|>"
    tok.save_pretrained(folder)
    ids = [tok.convert_tokens_to_ids(t) for t in generation_eos]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    return AutoTokenizer.from_pretrained(folder)


def test_a_template_ending_turns_on_a_token_the_model_never_stops_on_is_refused(
    tmp_path: Path,
) -> None:
    """Every turn would run to max_tokens (vLLM stops on eos and generation_config's ids only),
    and the warm start refused such a model naming no fix."""
    base = _base_model_tokenizer(tmp_path / "base", ["<|endoftext|>"])
    with pytest.raises(TemplateError) as refused:
        ChatRenderer(base)
    message = str(refused.value)
    assert "ends an assistant turn with '<|im_end|>'" in message
    assert "stops only on '<|endoftext|>'" in message
    assert "set eos_token to '<|im_end|>' in the model's tokenizer_config.json" in message
    assert "\n" not in message
    gemma_like = _base_model_tokenizer(tmp_path / "gemma", ["<|endoftext|>", "<|im_end|>"])
    assert ChatRenderer(gemma_like).stop_texts == ("<|endoftext|>", "<|im_end|>")
    # a template that writes nothing after a turn: the sampled stop token is its end
    no_turn_end = "{%- for m in messages %}{{- m.role + ': ' + (m.content or '') }}{%- endfor %}"
    assert renderer(no_turn_end).stop_texts == ("<|im_end|>",)


# DeepSeek-R1-Distill-like: a turn's calls are written only when its content is none.
CALLS_ONLY_WITHOUT_CONTENT = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.content is none %}{{- '<|im_start|>assistant\\n' }}"
    "{%- for c in m.tool_calls %}"
    "{{- '<tool_call>\\n' + (c.function | tojson) + '\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_that_writes_calls_only_without_content_gets_none() -> None:
    """The env gives a turn of calls alone the content "": under this template every call
    vanished from the prompts and the SFT traces, and the check blamed the env's parser."""
    from agentgym._check_template import call_format_problem
    from agentgym.parsers import get_parser

    r = renderer(CALLS_ONLY_WITHOUT_CONTENT)
    call = {"id": "c1", "type": "function",
            "function": {"name": "calculate", "arguments": {"expression": "1 + 2"}}}  # fmt: skip
    turn = {"role": "assistant", "content": "", "tool_calls": [call]}  # as the env writes it
    text = r.render_text([{"role": "user", "content": "q"}, turn], TOOLS, generation=False)
    assert '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1 + 2"}}' in text
    assert call_format_problem(r, TOOLS, get_parser("hermes")) == ""
    worded = {**turn, "content": "Let me compute."}  # text with calls: as the template says
    assert "<tool_call>" not in r.render_text([worded], TOOLS, generation=False)
    assert "<tool_call>" in renderer().render_text([turn], TOOLS, generation=False)  # ChatML


# Gemma-2-like: a system message is refused. Gemma-3-like: roles must alternate (no tool role).
REFUSES_SYSTEM = (
    "{%- if messages[0].role == 'system' %}{{- raise_exception('System role not supported') }}"
    "{%- endif %}" + CALLS_ONLY_WITHOUT_CONTENT
)
ALTERNATES = (
    "{%- set chat = messages[1:] if messages[0].role == 'system' else messages %}"
    "{%- for m in chat %}{%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{%- endif %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.parametrize(
    ("template", "role", "use"),
    [(REFUSES_SYSTEM, "system", "its system prompt"), (ALTERNATES, "tool", "tool results")],
    ids=["gemma2", "gemma3"],
)
def test_a_role_the_template_refuses_is_named_not_the_kwargs(
    template: str, role: str, use: str
) -> None:
    r = renderer(template)
    conversation = [{"role": "system", "content": "Be brief."}, *probe_conversation(TOOLS)]
    with pytest.raises(TemplateError) as refused:
        r.render_text(conversation, TOOLS, generation=True)
    message = str(refused.value)
    assert f"it refuses '{role}' messages, which the env sends ({use})" in message
    assert "chat_template_kwargs" not in message
    with pytest.raises(TemplateError, match="check the template and chat_template_kwargs"):
        renderer("{{ raise_exception('broken') }}{{ messages }}")  # no role to blame
