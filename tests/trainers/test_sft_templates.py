"""SFT on model families' chat-template behaviour (the templates of test_check_families.py).

Found as a user moving the quickstart to a real model would: the warm start refused every
template that rewrites history (Qwen3, with or without ``enable_thinking``), although the
rollout engine trains such models per turn; and it handed the template tool-call arguments as
the OpenAI-format JSON string, so a template that writes ``arguments | tojson`` (Qwen2.5's,
Qwen3's) taught the model a quoted string where its parser reads an object. Then it refused
Mistral v0.3 (the system prompt moves once the turn is written) and Qwen3 with
``enable_thinking=False`` where the finished turn lacks the prompt's empty think block,
though both say what the model writes after the engine's prompt.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import agentgym_here, model_with_template, require
from tests.test_check_families import MISTRAL_V03_LIKE, QWEN3_LIKE, THINKING_SWITCH, tokenizer
from tests.trainers.test_sft_cli import agentgym_cli

require("transformers")
from agentgym.engine._render import ChatRenderer  # noqa: E402
from agentgym.parsers import get_parser  # noqa: E402
from trainers._sft import _renderer, conversation_examples, oracle_conversations  # noqa: E402

CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "66 + 24"}}\n</tool_call>'


@pytest.fixture(scope="module")
def episode() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One calculator oracle conversation (a call, its result, the answer) and the tools."""
    conversations, tools = oracle_conversations("calculator", tasks=[0])
    return conversations[0], tools


def trained_text(tok: Any, ids: list[int], mask: list[int]) -> str:
    return str(tok.decode([i for i, m in zip(ids, mask, strict=True) if m]))


@pytest.mark.parametrize(
    ("template", "kwargs", "replies"),
    [
        (QWEN3_LIKE, {},
         [f"<think>\n\n</think>\n\n{CALL}<|im_end|>", "<think>\n\n</think>\n\nThe answer"]),
        # enable_thinking=False: the prompt opens the empty block, the model writes the rest
        (QWEN3_LIKE, {"enable_thinking": False},
         [f"{CALL}<|im_end|>", "The answer is 90.<|im_end|>"]),
        # the same where the finished turn has no think block at all: it does not extend its
        # prompt (this was refused), but says what follows the prompt
        (THINKING_SWITCH, {"enable_thinking": False},
         [f"{CALL}<|im_end|>", "The answer is 90.<|im_end|>"]),
    ],
    ids=["thinking", "enable_thinking=False", "enable_thinking=False-finished-turn-differs"],
)  # fmt: skip
def test_a_template_that_rewrites_history_trains_per_turn_as_the_rollouts_sample(
    episode: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    template: str,
    kwargs: dict[str, Any],
    replies: list[str],
) -> None:
    messages, tools = episode
    tok = tokenizer(template)
    samples, mode = conversation_examples(_renderer(tok, kwargs), messages, tools)
    assert mode == "per_turn" and len(samples) == 2  # one per assistant turn
    engine = ChatRenderer(tok, kwargs)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for sample, at, reply in zip(samples, turns, replies, strict=True):
        prompt = engine.prompt_ids(messages[:at], tools)  # the engine's per_turn prompt
        assert sample.ids[: len(prompt)] == prompt and sample.mask[: len(prompt)] == [0] * len(
            prompt
        )
        assert set(sample.mask[len(prompt) :]) == {1}  # everything after it is the model's
        assert trained_text(tok, sample.ids, sample.mask).startswith(reply)


def test_tool_call_arguments_reach_the_template_as_objects(
    episode: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    """A template keeping history (so one sequence) that writes ``arguments | tojson``."""
    messages, tools = episode
    tok = tokenizer(THINKING_SWITCH)
    [sample], mode = conversation_examples(_renderer(tok, {}), messages, tools)
    assert mode == "concat"
    trained = trained_text(tok, sample.ids, sample.mask)
    assert trained.startswith(CALL)  # was '"arguments": "{\"expression\": \"66 + 24\"}"'
    assert trained.endswith("The answer is 90.<|im_end|>")


def test_mistral_v03_trains_per_turn_on_the_engines_prompts_in_its_own_call_format() -> None:
    """Its template shows the system prompt only while a user message is last, so the finished
    turn does not extend its prompt: this was refused ("renders assistant message 2
    differently"), leaving Mistral models no warm start."""
    conversations, tools = oracle_conversations("calculator", {"parser": "mistral"}, tasks=[0])
    messages = conversations[0]
    tok = tokenizer(MISTRAL_V03_LIKE)
    samples, mode = conversation_examples(_renderer(tok, {}), messages, tools)
    assert mode == "per_turn" and len(samples) == 2
    engine = ChatRenderer(tok, {})
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    first_prompt = engine.prompt_ids(messages[: turns[0]], tools)
    assert "You are a careful assistant" in tok.decode(first_prompt)  # the prompt it is given
    parser = get_parser("mistral")
    for sample, at in zip(samples, turns, strict=True):
        prompt = engine.prompt_ids(messages[:at], tools)
        assert sample.ids[: len(prompt)] == prompt and set(sample.mask[len(prompt) :]) == {1}
        trained = trained_text(tok, sample.ids, sample.mask)
        assert trained.endswith(tok.eos_token)
        turn = parser.parse(trained[: -len(tok.eos_token)])
        expected = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                    for c in messages[at].get("tool_calls", [])]  # fmt: skip
        assert [(c.name, c.arguments) for c in turn.tool_calls] == expected and not turn.errors
    call = trained_text(tok, samples[0].ids, samples[0].mask)
    assert call.startswith('[TOOL_CALLS] [{"name": "calculate"') and '"id": "' in call
    answer = trained_text(tok, samples[1].ids, samples[1].mask)
    assert answer == f" The answer is 90.{tok.eos_token}"  # the template writes ' ' + content


def sft_on_family(
    agentgym: Callable[..., subprocess.CompletedProcess[str]],
    tiny_model_dir: Path, tmp_path: Path, template: str, tasks: str, *options: str,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`agentgym sft` of the tiny model with ``template`` on calculator ``tasks``; (run, OUT).

    Run by ``agentgym``: `agentgym_cli` for a refusal (the console script's one line, exit 2),
    `agentgym_here` for a run (what it trains, without a new process's seconds of imports).
    """
    model = model_with_template(tiny_model_dir, template, tmp_path / "family-shaped")
    out = tmp_path / "warm"
    done = agentgym("sft", model, out, "--env", "calculator", "--tasks", tasks,
                    "--batch-size", "4", *options)  # fmt: skip
    return done, out


def test_agentgym_sft_warm_starts_a_qwen3_shaped_model_per_turn(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    done, out = sft_on_family(
        agentgym_here, tiny_model_dir, tmp_path, QWEN3_LIKE, "0:6", "--steps", "2",
        "--chat-template-kwargs", '{"enable_thinking": false}',
        "--env-arg", "tool_prompt=system",  # this template leaves tools out: the env shows them
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # was: "does not keep history as a prefix"
    summary = json.loads((out / "sft.json").read_text())
    assert summary["conversations"] == {"concat": 0, "per_turn": 6}
    assert summary["num_examples"] == 12  # two turns each


def test_agentgym_sft_warm_starts_a_mistral_shaped_model(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    done, out = sft_on_family(
        agentgym_here, tiny_model_dir, tmp_path, MISTRAL_V03_LIKE, "0:4", "--steps", "2",
        "--env-arg", "parser=mistral", "--env-arg", "tool_prompt=system",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # was: "renders assistant message 2 differently"
    summary = json.loads((out / "sft.json").read_text())
    assert summary["conversations"] == {"concat": 0, "per_turn": 4}
    assert summary["num_examples"] == 8


def test_agentgym_sft_on_a_mistral_template_under_the_default_parser_names_the_parser(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The hermes parser's ids (``call_1_0``) fail Mistral's template: the error said "check
    the template", where the fix is the env's parser."""
    done, out = sft_on_family(agentgym_cli, tiny_model_dir, tmp_path, MISTRAL_V03_LIKE, "0:4",
                              "--steps", "1", "--env-arg", "tool_prompt=system")  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    fix = "use --env-arg parser=mistral (agentgym train: --set env_kwargs.parser=mistral)"
    assert len(lines) == 1 and lines[0].endswith(fix)
    assert not out.exists()


def test_a_turn_ends_where_the_engine_stops_it_on_a_generation_config_eos(
    tmp_path: Path, episode: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> None:
    """Gemma-like: eos ``<|endoftext|>``, turns end with ``<|im_end|>``, which the model's
    generation_config.json stops on. The warm start refused it ("does not end with eos") though
    the engine samples such turns; each turn now trains through the stop token it ends on."""
    from transformers import AutoTokenizer

    from agentgym.engine.tiny import make_tokenizer

    tok = make_tokenizer()
    tok.eos_token = "<|endoftext|>"
    tok.save_pretrained(tmp_path)
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>")]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    messages, tools = episode
    [example], mode = conversation_examples(_renderer(AutoTokenizer.from_pretrained(tmp_path),
                                                      None), messages, tools)  # fmt: skip
    assert mode == "concat"
    trained = trained_text(tok, example.ids, example.mask)
    assert trained.count("<|im_end|>") == 2 and trained.endswith("<|im_end|>")
    assert "<|endoftext|>" not in tok.decode(example.ids)
