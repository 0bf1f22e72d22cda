"""A user's journey with a tool-call format that is not Hermes (Llama 3.x JSON, Qwen3-Coder XML).

Found as a user would: ``agentgym sft MODEL OUT --env calculator --env-arg parser=llama3_json``
on a model whose chat template writes Hermes ``<tool_call>`` JSON (the tiny model's) trained
that format without a word, although the env's parser reads it as plain text: every rollout
after the warm start called no tool. The key property tested here: the tokens SFT trains for
an assistant turn, decoded as the rollout engine decodes a sampled turn, parse with the env's
parser into that turn's calls, and the env runs them.
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
from agentgym._errors import ConfigError
from tests.conftest import model_with_template, require
from tests.test_check_families import LLAMA31_LIKE, tokenizer

require("transformers")
from trainers._sft import (  # noqa: E402
    _renderer,
    conversation_examples,
    oracle_conversations,
    sft_on_conversations,
)

AGENTGYM = Path(sys.executable).parent / "agentgym"

#: Reproduces Qwen3-Coder's template: tools listed, calls as ``<function=f><parameter=a>`` XML
#: after an optional content line, tool results in a user turn.
QWEN3_CODER_LIKE = (
    "{%- for tool in tools %}{{- '<tools>' + tool.function.name + '</tools>\\n' }}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}{{- '<|im_start|>assistant' }}"
    "{%- if m.content %}{{- '\\n' + m.content | trim + '\\n' }}{%- endif %}"
    "{%- for c in m.tool_calls %}"
    "{{- '\\n<tool_call>\\n<function=' + c.function.name + '>\\n' }}"
    "{%- for k, v in c.function.arguments | items %}"
    "{{- '<parameter=' + k + '>\\n' + (v if v is string else v | tojson) + '\\n</parameter>\\n' }}"
    "{%- endfor %}{{- '</function>\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content }}"
    "{{- '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
#: parser -> (template reproducing its family, env options the template needs)
FAMILIES = {
    "llama3_json": (LLAMA31_LIKE, {"tool_prompt": "system"}),  # its template lists no tools
    "qwen3_coder": (QWEN3_CODER_LIKE, {}),
}


def trained_turns(tok: Any, ids: list[int], mask: list[int]) -> list[str]:
    """Each stretch of trained tokens, decoded as the engine decodes a turn, stop token cut."""
    turns: list[list[int]] = [[]]
    for token, trained in zip(ids, mask, strict=True):
        if trained:
            turns[-1].append(token)
        elif turns[-1]:
            turns.append([])
    texts = [tok.decode(run, skip_special_tokens=False) for run in turns if run]
    return [text.removesuffix(tok.eos_token) for text in texts]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "AGENTGYM_RUNS_DB": "off"}
    return subprocess.run(
        [str(AGENTGYM), *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.parametrize("parser", sorted(FAMILIES))
def test_sft_trains_calls_the_envs_parser_reads_back_and_runs(parser: str) -> None:
    template, options = FAMILIES[parser]
    env_kwargs = {"parser": parser, **options}
    conversations, tools = oracle_conversations("calculator", env_kwargs, tasks=[0])
    messages = conversations[0]
    tok = tokenizer(template)
    [sample], mode = conversation_examples(_renderer(tok, {}), messages, tools)
    assert mode == "concat"
    call_turn, answer_turn = trained_turns(tok, sample.ids, sample.mask)
    env = agentgym.make("calculator", **env_kwargs)
    env.reset(options={"task": 0})
    turn = env.parser.parse(call_turn)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        ("calculate", {"expression": "66 + 24"})
    ] and not turn.errors, call_turn
    replies, *_ = env.step(call_turn)  # the rollout's call, as the env runs it
    assert replies[0]["tool_calls"][0]["function"]["name"] == "calculate"
    assert replies[1]["role"] == "tool" and replies[1]["content"] == "90"
    assert answer_turn == "The answer is 90."
    env.close()


@pytest.mark.parametrize("parser", sorted(FAMILIES))
def test_sft_refuses_a_template_writing_another_format_naming_the_parser(
    parser: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The tiny model's template writes Hermes calls: was trained silently under any parser."""
    env_kwargs = {"parser": parser}
    conversations, tools = oracle_conversations("calculator", env_kwargs, tasks=[0, 1])
    source = {"kind": "env", "env_id": "calculator", "env_kwargs": env_kwargs}
    with pytest.raises(ConfigError) as caught:
        sft_on_conversations(tiny_model_dir, conversations, tools, tmp_path / "out", source=source)
    message = str(caught.value)
    assert f"the env's parser {parser!r} does not read" in message
    assert "<tool_call>" in message and "--env-arg parser=hermes" in message
    assert "\n" not in message and not (tmp_path / "out").exists()


def test_sft_refuses_a_template_whose_calls_no_parser_reads(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A template writing a broken call: the fix is the template, not another parser."""
    model = model_with_template(
        tiny_model_dir, LLAMA31_LIKE.replace('"parameters": ', '"parameters": {"x": '),
        tmp_path / "broken",
    )  # fmt: skip
    env_kwargs = {"parser": "llama3_json", "tool_prompt": "system"}
    conversations, tools = oracle_conversations("calculator", env_kwargs, tasks=[0])
    source = {"kind": "env", "env_id": "calculator", "env_kwargs": env_kwargs}
    with pytest.raises(ConfigError, match="chat template that writes the 'llama3_json' format"):
        sft_on_conversations(model, conversations, tools, tmp_path / "out", source=source)


def test_cli_check_and_sft_on_a_qwen3_coder_shaped_model(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = model_with_template(tiny_model_dir, QWEN3_CODER_LIKE, tmp_path / "coder")
    args = ("--env-arg", "parser=qwen3_coder")
    checked = cli("check", "calculator", "--model", str(model), *args)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "│ concat: 3 turns rebuild the conversation exactly" in checked.stdout
    out = tmp_path / "warm"
    trained = cli("sft", str(model), str(out), "--env", "calculator", "--tasks", "0:4",
                  "--steps", "1", "--batch-size", "2", *args)  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert "--env-arg parser=qwen3_coder" in trained.stdout  # the eval line keeps the format
    assert json.loads((out / "sft.json").read_text())["source"]["env_kwargs"] == {
        "parser": "qwen3_coder"
    }
    refused = cli("sft", str(tiny_model_dir), str(tmp_path / "no"), "--env", "calculator",
                  "--tasks", "0:4", "--steps", "1", *args)  # fmt: skip
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "it reads as the 'hermes' format" in lines[0]
