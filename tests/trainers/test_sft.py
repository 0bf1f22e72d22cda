"""trainers._sft: the oracle data, the assistant-only loss mask, a few steps, the saved folder."""

from __future__ import annotations

import json

import pytest

from agentgym._errors import ConfigError
from tests.conftest import require

ENV_KWARGS = {"num_tasks": 8, "seed": 3}
SMALL = {"hidden_size": 64, "num_heads": 1, "num_kv_heads": 1, "num_layers": 1}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    require("transformers")
    from transformers import AutoTokenizer

    from agentgym.engine.tiny import build_tokenizer

    return AutoTokenizer.from_pretrained(build_tokenizer(tmp_path_factory.mktemp("tok")))


def whole(tokenizer, messages, tools):
    """The one sample the warm start trains on a conversation (the template keeps history)."""
    from trainers._sft import _renderer, conversation_examples

    [example], mode = conversation_examples(_renderer(tokenizer, None), messages, tools)
    assert mode == "concat"
    return example


@pytest.fixture(scope="module")
def oracle():
    from trainers._sft import oracle_conversations

    return oracle_conversations("calculator", ENV_KWARGS)


def test_oracle_conversations_carry_real_tool_results(oracle) -> None:
    conversations, tools = oracle
    assert len(conversations) == ENV_KWARGS["num_tasks"]
    assert [t["function"]["name"] for t in tools] == ["calculate"]
    roles = [m["role"] for m in conversations[0]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    tool_result, final = conversations[0][3]["content"], conversations[0][4]["content"]
    assert final == f"The answer is {tool_result}."


def test_mask_covers_exactly_the_assistant_tokens(tokenizer, oracle) -> None:
    conversations, tools = oracle
    messages = conversations[0]
    example = whole(tokenizer, messages, tools)
    full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    # the same text, token for token, up to the "\n" after the last <|im_end|> (never sampled)
    assert tokenizer.decode(example.ids) + "\n" == full
    assert len(example.mask) == len(example.ids)
    trained = [i for i, m in zip(example.ids, example.mask) if m]
    call = tokenizer.apply_chat_template(messages[:3], tools=tools, tokenize=False)
    call = call[
        len(
            tokenizer.apply_chat_template(
                messages[:2], tools=tools, tokenize=False, add_generation_prompt=True
            )
        ) :
    ]
    expected = call.removesuffix("\n") + messages[4]["content"] + "<|im_end|>"
    assert tokenizer.decode(trained) == expected
    # two runs of trained tokens (one per assistant turn), each ending with <|im_end|>
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ends = [
        k
        for k in range(len(example.mask))
        if example.mask[k] and (k + 1 == len(example.mask) or not example.mask[k + 1])
    ]
    assert [example.ids[k] for k in ends] == [eos, eos]
    assert example.mask[ends[0] + 1] == 0  # the "\n" after <|im_end|> is prompt, not loss


def test_template_that_rewrites_history_is_refused(tokenizer, oracle) -> None:
    from trainers._sft import HistoryRewrittenError, _renderer, _whole_conversation

    conversations, tools = oracle
    bad = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    bad.chat_template = (
        "{%- for m in messages %}{%- if m.role == 'assistant' and not loop.last %}[old]"
        "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    with pytest.raises(HistoryRewrittenError, match="prefix"):
        _whole_conversation(_renderer(bad, None), conversations[0], tools)
    assert issubclass(HistoryRewrittenError, ConfigError)


def test_config_is_checked_before_anything_loads() -> None:
    from trainers._sft import SFTConfig

    with pytest.raises(ConfigError, match="steps"):
        SFTConfig(steps=0)
    with pytest.raises(ConfigError, match="method"):
        SFTConfig(method="qlora")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="eval_every"):
        SFTConfig(target_accuracy=0.5)
    with pytest.raises(ConfigError, match=r"SFTConfig.device must be cpu, cuda or cuda:N"):
        SFTConfig(device="gpu0")
    assert SFTConfig(device="cuda:1").device == "cuda:1"  # checked against the machine later


def test_a_checkpoint_of_other_knobs_is_refused_naming_them_before_the_model_loads(
    tmp_path,
) -> None:
    """The refusal came after the weights loaded and said only "other knobs, model or
    traces"; it is read off the checkpoint's record now, and names what differs."""
    from trainers._sft import SFTConfig, _Checkpoint, _knobs

    path = tmp_path / "out.partial" / "state.pt"
    saved = _Checkpoint(path, "run-a", _knobs(SFTConfig(steps=60)), "models/tiny")
    saved.write_record()
    path.write_bytes(b"the weights")  # never read: the record decides
    other = _Checkpoint(path, "run-b", _knobs(SFTConfig(steps=30, lr=2e-4)), "models/tiny")
    with pytest.raises(ConfigError) as refused:
        other.refuse_another_run()
    said = str(refused.value)
    assert "holds a checkpoint of another SFT run, whose SFTConfig.lr (saved 0.002, now 0.0002)" \
        in said and "\n" not in said
    assert "steps" not in said and "delete that folder" in said  # steps may change on resume
    traces = _Checkpoint(path, "run-c", _knobs(SFTConfig(steps=60)), "models/tiny")
    with pytest.raises(ConfigError, match="another SFT run, whose traces differ"):
        traces.refuse_another_run()
    _Checkpoint(path, "run-a", {}, "").refuse_another_run()  # its own run: resumed


def test_a_few_steps_lower_the_loss_and_the_folder_loads(tmp_path) -> None:
    torch = require("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.engine.tiny import build_tiny_model
    from trainers._sft import (
        SFTConfig,
        _collate,
        masked_loss,
        oracle_conversations,
        sft_warm_start,
    )

    base = build_tiny_model(tmp_path / "base", **SMALL)
    config = SFTConfig(steps=8, lr=3e-3, batch_size=8, warmup_steps=1, seed=5, num_threads=1)
    out = sft_warm_start(base, "calculator", ENV_KWARGS, tmp_path / "sft", config)
    again = sft_warm_start(base, "calculator", ENV_KWARGS, tmp_path / "sft2", config)

    tokenizer = AutoTokenizer.from_pretrained(out)
    conversations, tools = oracle_conversations("calculator", ENV_KWARGS)
    batch = _collate([whole(tokenizer, c, tools) for c in conversations])
    with torch.no_grad():
        before = masked_loss(AutoModelForCausalLM.from_pretrained(base), batch).item()
        trained = AutoModelForCausalLM.from_pretrained(out)
        after = masked_loss(trained, batch).item()
        twin = masked_loss(AutoModelForCausalLM.from_pretrained(again), batch).item()
    assert after < before - 0.5
    assert after == twin  # same seed, same weights
    assert tokenizer.chat_template and (out / "model.safetensors").exists()
    summary = json.loads((out / "sft.json").read_text())
    assert len(summary["history"]) == 8 and summary["num_examples"] == 8


def test_lora_method_saves_a_merged_plain_model(tmp_path) -> None:
    require("peft")
    from safetensors.torch import load_file

    from agentgym.engine.tiny import build_tiny_model
    from trainers._sft import SFTConfig, sft_warm_start

    base = build_tiny_model(tmp_path / "base", **SMALL)
    config = SFTConfig(steps=2, batch_size=4, method="lora", lora_rank=8, num_threads=1)
    out = sft_warm_start(base, "calculator", ENV_KWARGS, tmp_path / "sft", config)
    names = load_file(out / "model.safetensors").keys()
    assert names and not any("lora" in n for n in names)
    assert set(names) == set(load_file(base / "model.safetensors").keys())


def test_a_script_mix_splits_the_tasks_by_share_and_keeps_failing_habits() -> None:
    from trainers._sft import mixed_conversations

    tasks = list(range(8))
    mix = {"reference": 0.25, "estimate": 0.75}
    conversations, _, dropped = mixed_conversations("calculator", ENV_KWARGS, tasks, mix, seed=1)
    again = mixed_conversations("calculator", ENV_KWARGS, tasks, mix, seed=1).conversations
    assert not dropped  # every habit is kept, right or wrong
    assert conversations == again  # a seeded split
    with_tool = [c for c in conversations if any(m["role"] == "tool" for m in c)]
    direct = [c for c in conversations if not any(m["role"] == "tool" for m in c)]
    assert (len(with_tool), len(direct)) == (2, 6)
    # the estimates are kept although they are (nearly always) wrong answers
    assert all(c[-1]["content"].startswith("The answer is ") for c in direct)
    questions = sorted(c[1]["content"] for c in conversations)
    assert len(set(questions)) == 8  # every task played once, by one script
    with pytest.raises(ConfigError, match="has no guess_turns"):
        mixed_conversations("calculator", ENV_KWARGS, tasks, {"guess": 1.0})


def test_reference_accuracy_leaves_the_first_token_the_strategy_to_rl(tokenizer, oracle) -> None:
    torch = require("torch")
    from types import SimpleNamespace

    from trainers._sft import _collate, reference_accuracy

    conversations, tools = oracle
    examples = [whole(tokenizer, c, tools) for c in conversations[:2]]
    batch = _collate(examples)
    vocab = len(tokenizer)

    def model_that_predicts(wrong_at: str):  # a stand-in "model": logits that spell the labels
        def forward(input_ids, attention_mask, logits_to_keep):
            targets = batch["labels"][:, 1:].clamp(min=0)
            logits = torch.nn.functional.one_hot(targets, vocab).float()
            trained = batch["labels"][:, 1:] != -100
            first = trained.int().argmax(-1)
            column = first if wrong_at == "first" else first + 3  # +3: inside the tool call
            logits[torch.arange(len(first)), column] = torch.roll(
                logits[torch.arange(len(first)), column], 1, dims=-1
            )
            pad = torch.zeros(len(first), 1, vocab)
            return SimpleNamespace(logits=torch.cat([logits, pad], dim=1)[:, -logits_to_keep:])

        return forward

    assert reference_accuracy(model_that_predicts("first"), examples) == 1.0
    assert reference_accuracy(model_that_predicts("later"), examples) == 0.0
