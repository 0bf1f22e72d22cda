"""`agentgym check` on model families' chat-template behaviour, as a new user runs it.

Each template here is written for this test and reproduces one behaviour of a real family's
template (the real ones were tried by hand; they are not copied):

- Hermes-3 (tool_use): loops over ``tools`` unconditionally, drops an assistant's text before
  its calls, and ends the *last* tool message without the newline it gets once followed.
- Mistral-7B-Instruct-v0.3: shows the system prompt only while the user message is the last
  message, requires 9-character tool-call ids, writes ``[TOOL_CALLS] [{..., "id": ...}]``.
- Qwen3: writes an empty ``<think></think>`` into the last turn and drops it once the turn is
  followed (a thinking model's non-empty block stays); ``enable_thinking=False`` opens every
  generation prompt with an empty one.
- Llama 3.1: drops an assistant's text before its call.
- DeepSeek V3.1: ignores ``tools``, and concatenates a call's arguments as JSON text, the
  calls back to back in V3.1's short form (``NAME<｜tool▁sep｜>{...}``).

All but Hermes-3's leave ``tools`` out (the real Qwen3, Mistral and Llama ones show them), so
the command-line checks below of the Qwen3- and Mistral-like ones give the env's
``tool_prompt=system``, as a run with such a template must.

The check must say what the engine does (``rollout mode``, decided with
`ChatRenderer.decide_mode` over consecutive prompts) and blame the right cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym.engine.tiny import make_tokenizer
from agentgym.parsers import get_parser
from tests.conftest import require

AGENTGYM = Path(sys.executable).parent / "agentgym"

_CHATML_TURNS = (
    "{%- if m.role == 'user' or m.role == 'system' %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
)
HERMES3_LIKE = (
    "{%- for tool in tools %}{{- '<tools>' + tool.function.name + '</tools>\\n' }}{%- endfor %}"
    "{%- for m in messages %}"
    + _CHATML_TURNS
    + "{%- elif m.role == 'assistant' and m.tool_calls is not defined %}"
    "{{- '<|im_start|>assistant\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- for c in m.tool_calls %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + c.function.name + \'", "arguments": \''
    " + c.function.arguments | tojson + '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.previtem.role != 'tool' %}{{- '<|im_start|>tool\\n' }}{%- endif %}"
    "{{- '<tool_response>\\n' + m.content }}"
    "{{- '\\n</tool_response>\\n' if not loop.last else '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MISTRAL_V03_LIKE = (
    "{%- set sys = messages[0].content if messages[0].role == 'system' else none %}"
    "{%- for m in (messages[1:] if sys is not none else messages) %}"
    "{%- if m.role == 'user' %}"
    "{{- '[INST] ' + (sys + '\\n\\n' if loop.last and sys is not none else '') + m.content"
    " + '[/INST]' }}"
    "{%- elif m.tool_calls is defined %}{{- '[TOOL_CALLS] [' }}"
    "{%- for c in m.tool_calls %}"
    "{%- if c.id is not defined or c.id | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}"
    "{{- (c.function | tojson)[:-1] + ', \"id\": \"' + c.id + '\"}' }}"
    "{{- ', ' if not loop.last else ']' + eos_token }}"
    "{%- endfor %}"
    "{%- elif m.role == 'assistant' %}{{- ' ' + m.content | trim + eos_token }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if m.tool_call_id | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}"
    "{{- '[TOOL_RESULTS] ' + m.content + '[/TOOL_RESULTS]' }}"
    "{%- endif %}{%- endfor %}"
)
_HERMES_CALLS = (
    "{%- for c in (m.tool_calls or []) %}"
    "{{- '\\n' if content or not loop.first else '' }}"
    '{{- \'<tool_call>\\n{"name": "\' + c.function.name + \'", "arguments": \''
    " + c.function.arguments | tojson + '}\\n</tool_call>' }}"
    "{%- endfor %}"
)
#: A Qwen assistant turn's end, then tool results as a user turn in ``<tool_response>``.
_QWEN_TOOL_RESULTS = (
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content }}"
    "{{- '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
)
QWEN3_LIKE = (
    "{%- for m in messages %}" + _CHATML_TURNS + "{%- elif m.role == 'assistant' %}"
    "{%- set content = m.content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- set reasoning = m.content.split('</think>')[0].split('<think>')[-1].strip('\\n')"
    " if '</think>' in m.content else '' %}"
    "{%- if loop.last or reasoning %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    + _HERMES_CALLS
    + _QWEN_TOOL_RESULTS
    + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
# Keeps history as written; only `enable_thinking=False` opens prompts with an empty think
# block that the finished turn does not have: the kwarg alone decides the mode.
THINKING_SWITCH = QWEN3_LIKE.replace("{%- if loop.last or reasoning %}", "{%- if reasoning %}")
LLAMA31_LIKE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls is defined %}"
    "{%- set c = m.tool_calls[0].function %}"
    '{{- \'<|im_start|>assistant\\n{"name": "\' + c.name + \'", "parameters": \''
    " + c.arguments | tojson + '}<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Ignores ``tools``; concatenates each call's arguments as text, the calls back to back in
# V3.1's short form; nothing opens the turn after a tool result. A turn ends with the eos token
# (the real template writes ``<｜end▁of▁sentence｜>``, its tokenizer's eos).
_DS = "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
DEEPSEEK_V31_LIKE = (
    "{%- set ns = namespace(last_user=false) %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}{{- m.content }}"
    "{%- elif m.role == 'user' %}{%- set ns.last_user = true %}{{- '<｜User｜>' + m.content }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- if ns.last_user %}{{- '<｜Assistant｜></think>' }}{%- endif %}"
    "{%- set ns.last_user = false %}{{- m.content }}"
    "{%- if m.tool_calls is defined %}{{- '" + _DS[0] + "' }}"
    "{%- for c in m.tool_calls %}"
    "{{- '" + _DS[1] + "' + c.function.name + '" + _DS[2] + "' + c.function.arguments"
    " + '" + _DS[3] + "' }}{%- endfor %}{{- '<｜tool▁calls▁end｜>' }}{%- endif %}"
    "{{- eos_token }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<｜tool▁output▁begin｜>' + m.content + '<｜tool▁output▁end｜>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt and ns.last_user %}{{- '<｜Assistant｜></think>' }}{%- endif %}"
)


def tokenizer(template: str) -> Any:
    require("transformers")
    tok = make_tokenizer(("[TOOL_CALLS]",))
    tok.chat_template = template
    return tok


def rows(template: str, **kwargs: Any) -> dict[str, agentgym.CheckResult]:
    results = agentgym.check("calculator", tokenizer=tokenizer(template), **kwargs)
    assert not [r for r in results if r.name == "check crashed"], results
    return {r.name: r for r in results}


# ---- Hermes-3 --------------------------------------------------------------------------------
def test_hermes3_last_tool_message_newline_is_caught_on_consecutive_prompts() -> None:
    found = rows(HERMES3_LIKE)
    mode = found["rollout mode"].detail
    # turn 2's prompt ends "</tool_response><|im_end|>"; once turn 2 exists a "\n" precedes
    # <|im_end|>: only consecutive prompts, as the engine builds them, show it
    assert mode.startswith("per_turn: the prompt of assistant turn 2 changes"), mode
    assert "'<|im_end|><|im_start|>assistant\\n'" in mode and "'\\n<|im_end|>" in mode
    round_trip = found["chat template round trip"]
    assert round_trip.verdict == "warn"  # the family's own template drops it: not a failure
    assert "assistant turn 2 was produced as 'Let me double-" in round_trip.detail
    assert "drops the text before a tool call ('Let me double-check that.')" in round_trip.detail


# ---- Mistral v0.3 ----------------------------------------------------------------------------
def test_mistral_ids_fit_the_template_and_the_moved_system_prompt_means_per_turn() -> None:
    found = rows(MISTRAL_V03_LIKE, parser="mistral")
    assert "chat template" not in found, found.get("chat template")  # no id was refused
    mode = found["rollout mode"].detail
    assert mode.startswith("per_turn: the prompt of assistant turn 1 changes"), mode
    assert "has 'You are a ca" in mode  # the system prompt, gone once the turn is added
    round_trip = found["chat template round trip"].detail
    # turn 1 (a call the env wrote with an id) renders as produced; turn 2's text is dropped
    assert round_trip.startswith("assistant turn 2 was produced as"), round_trip
    assert "drops the text before a tool call" in round_trip


def test_mistral_under_the_default_parser_names_the_parser_not_the_template() -> None:
    """Its template refuses hermes' ``call_1_0`` ids: the row said "check the template"."""
    detail = rows(MISTRAL_V03_LIKE)["chat template"].detail
    assert "Tool call IDs should be alphanumeric" in detail
    fix = "use --env-arg parser=mistral (agentgym train: --set env_kwargs.parser=mistral)"
    assert detail.endswith(fix), detail


def test_mistral_env_keeps_the_models_ids_and_assigns_ids_that_fit() -> None:
    env = agentgym.make("calculator", parser="mistral")
    env.reset(options={"task": 0})
    written = '[TOOL_CALLS] [{"name": "calculate", "arguments": {"expression": "1+1"}, "id": '
    messages, *_ = env.step(written + '"aB3dE6gH9"}, {"name": "calculate", "arguments": {}}]')
    calls = messages[0]["tool_calls"]
    assert calls[0]["id"] == "aB3dE6gH9"  # the model's own id
    assert len(calls[1]["id"]) == 9 and calls[1]["id"].isalnum()  # assigned, of that shape
    assert [m["tool_call_id"] for m in messages[1:]] == [c["id"] for c in calls]
    tok = tokenizer(MISTRAL_V03_LIKE)
    history = [*env.messages, {"role": "assistant", "content": "2"}]
    for c in history[2]["tool_calls"]:
        c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    assert "aB3dE6gH9" in tok.apply_chat_template(history, tokenize=False)  # not refused
    env.close()


# ---- Qwen3 -----------------------------------------------------------------------------------
def test_qwen3_thinking_turns_keep_their_reasoning_so_concat() -> None:
    """With thinking on, the model opens each turn with a <think> block, which Qwen3 keeps."""
    found = rows(QWEN3_LIKE)
    mode = found["rollout mode"].detail
    assert mode.startswith("concat") and "opening with the <think> block" in mode, mode
    assert found["chat template round trip"].passed, found["chat template round trip"]


def test_qwen3_without_thinking_drops_the_empty_think_block_so_per_turn() -> None:
    found = rows(QWEN3_LIKE, chat_template_kwargs={"enable_thinking": False})
    mode = found["rollout mode"].detail
    assert mode.startswith("per_turn: the template rewrites assistant turn 1"), mode
    assert "renders as '<think>\\n\\n</think>\\n\\n<tool_call>" in mode
    assert "but as '<tool_call>" in mode
    assert found["chat template round trip"].passed, found["chat template round trip"]


def test_enable_thinking_is_settable_and_decides_the_mode() -> None:
    plain = rows(THINKING_SWITCH)
    assert plain["rollout mode"].detail.startswith("concat"), plain["rollout mode"]
    off = rows(THINKING_SWITCH, chat_template_kwargs={"enable_thinking": False})
    assert off["chat template kwargs"].passed
    assert off["chat template kwargs"].detail == "enable_thinking=False: read by the template"
    mode = off["rollout mode"].detail
    assert mode.startswith("per_turn") and "has '<think>\\n\\n</think>\\n\\n'" in mode, mode


def test_a_misspelt_template_kwarg_fails_with_the_name_it_meant() -> None:
    typo = rows(THINKING_SWITCH, chat_template_kwargs={"enable_thinkng": False})
    kwargs = typo["chat template kwargs"]
    assert not kwargs.passed
    assert "never reads 'enable_thinkng'" in kwargs.detail
    assert "did you mean 'enable_thinking'" in kwargs.detail


# ---- Llama 3.1 -------------------------------------------------------------------------------
def test_llama31_dropped_text_before_a_call_is_blamed_on_the_template() -> None:
    found = rows(LLAMA31_LIKE, parser="llama3_json")
    assert found["rollout mode"].detail.startswith("concat"), found["rollout mode"]
    round_trip = found["chat template round trip"]
    assert round_trip.passed and round_trip.verdict == "warn"  # concat keeps what was sampled
    assert "the template drops the text before a tool call" in round_trip.detail
    assert "parser does not read" not in round_trip.detail


# ---- DeepSeek V3.1 ---------------------------------------------------------------------------
def test_deepseek_v31_names_the_parser_that_writes_its_calls_and_the_unseen_tools() -> None:
    """Under ``deepseek_v3`` the calls read back but are written in V3's form, and the
    template never shows the tools: both rows name the fix (they said "make the parser's
    render match the template", and nothing about the tools, which the trainer refused)."""
    found = rows(DEEPSEEK_V31_LIKE, parser="deepseek_v3")
    unseen = found["tools in the prompt"]
    assert not unseen.passed and "missing from the prompt" in unseen.detail
    assert "--env-arg tool_prompt=system" in unseen.detail
    round_trip = found["chat template round trip"]
    assert not round_trip.passed, round_trip
    assert "the template writes the same calls as the 'deepseek_v31' parser" in round_trip.detail
    assert round_trip.detail.endswith("SFT traces are what the template writes")


def test_deepseek_v31_with_its_parser_and_the_tools_listed_passes_in_concat() -> None:
    found = rows(DEEPSEEK_V31_LIKE, parser="deepseek_v31", tool_prompt="system")
    assert found["tools in the prompt"].detail == (
        "the env's system prompt lists them (tool_prompt='system')"
    )
    assert found["rollout mode"].detail.startswith("concat"), found["rollout mode"]
    assert found["chat template round trip"].detail == "3 assistant turns render as produced"
    assert [r for r in found.values() if r.verdict != "pass"] == []


# ---- parsers the check cannot render with ----------------------------------------------------
@pytest.mark.vllm
def test_gpt_oss_parser_rows_say_cannot_render_instead_of_crashing() -> None:
    require("vllm")
    found = rows(QWEN3_LIKE, parser="vllm:openai")
    assert found["parser round trip (vllm:openai)"].detail.startswith("cannot render")
    assert found["reference episode"].detail.startswith("skipped: cannot render")
    assert found["reference episode"].verdict == "skip"  # nothing played: not a pass
    # the mode is still decided, on the engine's generic conversation
    assert "on a generic two-call conversation (cannot render" in found["rollout mode"].detail


# ---- through the installed console script ----------------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [str(AGENTGYM), *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tokenizer folders (as a user's model folder holds them) for the templates above."""
    root = tmp_path_factory.mktemp("families")
    folders = {}
    families = [
        ("hermes3", HERMES3_LIKE),
        ("switch", THINKING_SWITCH),
        ("mistral", MISTRAL_V03_LIKE),
    ]
    for name, template in families:
        tokenizer(template).save_pretrained(root / name)
        folders[name] = root / name
    # what a user gets copying tokenizer_config.json alone: it loads, with no vocabulary
    config = json.loads((folders["hermes3"] / "tokenizer_config.json").read_text())
    (root / "vocabless").mkdir()
    config_only = {**config, "tokenizer_class": "Qwen2Tokenizer"}
    (root / "vocabless" / "tokenizer_config.json").write_text(json.dumps(config_only))
    folders["vocabless"] = root / "vocabless"
    return folders


def test_cli_check_model_reports_the_mode_warns_on_dropped_text_and_fails_a_format(
    family_dirs: dict[str, Path],
) -> None:
    """Dropped text before a call is how Hermes-3, Llama 3.1 and Mistral write history: it
    warns (it exited 1, so every such model 'failed' its check); calls in a format the
    parser does not read still fail."""
    proc = cli("check", "calculator", "--model", str(family_dirs["hermes3"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "rollout mode" in proc.stdout and "per_turn: the prompt of assistant turn 2" in proc.stdout
    )
    assert "│ warn   │ assistant turn 2 was produced as" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr
    other = cli("check", "calculator", "--model", str(family_dirs["hermes3"]),
                "--env-arg", "parser=llama3_json")  # fmt: skip
    assert other.returncode == 1, other.stdout + other.stderr
    assert "parser does not read" in other.stdout and "Traceback" not in other.stderr


def test_cli_check_passes_chat_template_kwargs(family_dirs: dict[str, Path]) -> None:
    folder = str(family_dirs["switch"])
    listed = ("--env-arg", "tool_prompt=system")  # the template leaves tools out
    plain = cli("check", "calculator", "--model", folder, *listed)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "│ concat:" in plain.stdout
    off = cli("check", "calculator", "--model", folder, *listed, "--chat-template-kwargs",
              '{"enable_thinking": false}')  # fmt: skip
    assert off.returncode == 0, off.stdout + off.stderr
    assert "│ per_turn:" in off.stdout and "read by the template" in off.stdout
    typo = cli("check", "calculator", "--tokenizer", folder, "--chat-template-kwargs",
               '{"enable_thinkng": false}')  # fmt: skip
    assert typo.returncode == 1 and "did you mean 'enable_thinking'" in typo.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--chat-template-kwargs", "{enable_thinking: false}"], "JSON object",
                     id="kwargs-not-json"),
        pytest.param(["--chat-template-kwargs", "[1]"], "JSON object", id="kwargs-not-object"),
        pytest.param(["--model", "/nonexistent/model"], "no folder at /nonexistent/model; pass",
                     id="model-folder-missing"),  # not "Repo id must be in the form ..."
        pytest.param(["--model", "/tmp"], "cannot load a tokenizer",
                     id="model-without-tokenizer"),
        pytest.param(["--env-arg", "parser=qwen3_codr"], "Did you mean 'qwen3_coder'",
                     id="parser-typo"),
        pytest.param(["--model", "/nonexistent/model", "--env-arg", "parser=qwen3_codr"],
                     "Did you mean 'qwen3_coder'", id="parser-typo-refused-before-the-model-loads"),
        pytest.param(["--env-arg", "parser=[/INST]"], "parser '[/INST]'",
                     id="input-that-looks-like-console-markup"),
        pytest.param(["--env-arg", "max_turns=abc"], "max_turns='abc' is not valid",
                     id="option-of-the-wrong-type"),
    ],
)  # fmt: skip
def test_cli_check_user_errors_are_one_line_exit_2(
    family_dirs: dict[str, Path], args: list[str], message: str
) -> None:
    if "--model" not in args:
        args = ["--model", str(family_dirs["switch"]), *args]
    proc = cli("check", "calculator", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], proc.stderr


def test_cli_check_prints_template_text_as_written(family_dirs: dict[str, Path]) -> None:
    # Mistral's markers look like the console's markup ('[/INST]' closes a tag never opened)
    proc = cli("check", "calculator", "--model", str(family_dirs["mistral"]),
               "--env-arg", "parser=mistral", "--env-arg", "tool_prompt=system")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr  # its round trip warns, no more
    assert "Traceback" not in proc.stderr and "[/INST]" in proc.stdout, proc.stderr
    assert "[TOOL_CALLS]" in proc.stdout and "drops the text before a tool call" in proc.stdout


def test_cli_check_refuses_a_tokenizer_that_lost_its_vocabulary(
    family_dirs: dict[str, Path],
) -> None:
    # it loads and encodes every text to no ids, so each template row would pass on nothing
    proc = cli("check", "calculator", "--model", str(family_dirs["vocabless"]))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "its vocabulary is missing" in lines[0], proc.stderr
    assert "tokenizer.json" in lines[0] and "rollout mode" not in proc.stdout


@pytest.mark.vllm
def test_cli_check_vllm_parser_without_its_markers_names_the_fix(
    family_dirs: dict[str, Path],
) -> None:
    require("vllm")
    # the model's tokenizer (here: one without DeepSeek's tokens) is what vllm: parsers read
    proc = cli("check", "calculator", "--model", str(family_dirs["switch"]),
               "--env-arg", "parser=vllm:deepseek_v3")  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pass the model's tokenizer" in proc.stderr and "Traceback" not in proc.stderr
    assert get_parser("vllm:deepseek_v3").name == "vllm:deepseek_v3"  # default tokenizer: fine


def test_a_template_that_drops_calls_is_blamed_not_the_parser() -> None:
    """Phi-4-mini's, Granite 3.3's and SmolLM2's templates write a turn's content only: the
    row said the template writes calls the 'hermes' parser does not read."""
    content_only = (
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') }}"
        "{{- '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    round_trip = rows(content_only, tool_prompt="system")["chat template round trip"]
    assert not round_trip.passed
    assert "the template drops the turn's tool calls" in round_trip.detail
    assert "parser does not read" not in round_trip.detail
