"""agentgym.engine.tiny: deterministic tiny models, the byte tokenizer and its chat template."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json

import pytest

from agentgym._errors import ConfigError
from agentgym.parsers import ToolCall, get_parser
from tests.conftest import CALCULATE_TOOL, require

SMALL = {"hidden_size": 64, "num_heads": 1, "num_kv_heads": 1, "num_layers": 1}
TOOLS = [CALCULATE_TOOL]
CALLS = [
    ToolCall("calculate", {"expression": "37 * 48"}),
    ToolCall("calculate", {"expression": "1+1"}),
]
CONVERSATION = [
    {"role": "system", "content": "Solve it."},
    {"role": "user", "content": "What is 37 * 48?"},
    {
        "role": "assistant",
        "content": "Let me compute.",
        "tool_calls": [
            # OpenAI wire format (arguments a JSON string) and a dict: both render the same.
            CALLS[0].to_openai(),
            {
                "type": "function",
                "function": {"name": "calculate", "arguments": {"expression": "1+1"}},
            },
        ],
    },
    {"role": "tool", "content": "1776"},
    {"role": "tool", "content": "2"},
    {"role": "assistant", "content": "The answer is 1776."},
]


def _weights_hash(path) -> str:
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for name, tensor in sorted(load_file(path / "model.safetensors").items()):
        digest.update(name.encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    require("transformers")
    from transformers import AutoTokenizer

    from agentgym.engine.tiny import build_tokenizer

    return AutoTokenizer.from_pretrained(build_tokenizer(tmp_path_factory.mktemp("tok")))


def test_same_seed_same_weights_other_seed_other_weights(tmp_path) -> None:
    require("torch")
    from agentgym.engine.tiny import build_tiny_model

    a = build_tiny_model(tmp_path / "a", seed=3, **SMALL)
    b = build_tiny_model(tmp_path / "b", seed=3, **SMALL)
    c = build_tiny_model(tmp_path / "c", seed=4, **SMALL)
    assert _weights_hash(a) == _weights_hash(b) != _weights_hash(c)


def test_cache_is_keyed_by_config_and_reused(tmp_path, monkeypatch) -> None:
    require("torch")
    from agentgym.engine.tiny import build_tiny_model

    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    first = build_tiny_model(**SMALL)
    assert first.parent == tmp_path / "tiny"
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(**SMALL) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert build_tiny_model(seed=1, **SMALL) != first
    config = json.loads((first / "config.json").read_text())
    assert config["head_dim"] == 64 and config["vocab_size"] == 261


def test_a_second_build_of_the_same_folder_waits_then_reuses_the_first(
    tmp_path, monkeypatch
) -> None:
    """torchrun ranks build one cached model at once: one builds, the others wait and reuse it.

    Before the lock, a rank that found no build could delete the one another rank had just
    put in place, while that rank loaded it. Here the first builder does not write until the
    second is blocked on the lock (its lock taken without blocking fails first, and says so).
    """
    require("torch")
    import fcntl
    import threading

    from agentgym.engine import tiny

    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    building, contended, builds = threading.Event(), threading.Event(), []
    write_model, flock = tiny._write_model, fcntl.flock

    def flock_noting_contention(handle, operation):
        try:
            flock(handle, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            contended.set()
            flock(handle, operation)

    def write_once_the_other_waits(out, spec):
        builds.append(out)
        building.set()
        assert contended.wait(timeout=60), "the second build never waited for the lock"
        write_model(out, spec)

    monkeypatch.setattr(tiny.fcntl, "flock", flock_noting_contention)
    monkeypatch.setattr(tiny, "_write_model", write_once_the_other_waits)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(tiny.build_tiny_model, **SMALL)
        assert building.wait(timeout=60)
        second = pool.submit(tiny.build_tiny_model, **SMALL)
        assert first.result() == second.result()
    assert len(builds) == 1  # the second found the first's build and reused it


def test_a_build_on_a_distributed_rank_other_than_0_writes_the_whole_model(tmp_path) -> None:
    """torchrun's ranks each build the model they train; transformers' ``save_pretrained``
    writes nothing on a rank other than 0, which left builds with a tokenizer and no model.
    torch's fake process-group backend puts this process at rank 1 of 2 without a peer."""
    require("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from agentgym.engine.tiny import build_tiny_model

    dist.init_process_group("fake", rank=1, world_size=2, store=FakeStore())
    try:
        out = build_tiny_model(tmp_path / "rank1", **SMALL)
    finally:
        dist.destroy_process_group()
    assert _weights_hash(out) == _weights_hash(build_tiny_model(tmp_path / "alone", **SMALL))
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert (out / "generation_config.json").is_file()


def test_a_build_that_lost_its_weights_is_rebuilt(tmp_path, monkeypatch) -> None:
    require("torch")
    from agentgym.engine.tiny import build_tiny_model

    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    first = build_tiny_model(**SMALL)
    (first / "model.safetensors").unlink()  # the marker stays, as a rank > 0 build left it
    assert build_tiny_model(**SMALL) == first
    assert (first / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("shape", "needle"),
    [
        ({"hidden_size": 64, "num_heads": 4}, "head_dim >= 32"),
        ({"num_kv_heads": 0}, ">= 1"),
        ({"num_heads": 0}, ">= 1"),
    ],
)
def test_bad_shape_is_a_config_error(shape: dict[str, int], needle: str) -> None:
    from agentgym.engine.tiny import build_tiny_model

    with pytest.raises(ConfigError, match=needle):
        build_tiny_model(**shape)


def test_tokenizer_round_trip_one_token_per_byte(tokenizer) -> None:
    text = "Voilà: 37 * 48 = 1776 ✓ <tool_call>{}</tool_call>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    digits = tokenizer.encode("0123456789", add_special_tokens=False)
    assert digits == list(b"0123456789")  # byte ids: every digit is its own token
    assert len(tokenizer.encode("é", add_special_tokens=False)) == 2  # two UTF-8 bytes
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"):
        assert len(tokenizer.encode(special, add_special_tokens=False)) == 1, special
    assert tokenizer.eos_token == "<|im_end|>"
    # Tool-call tags survive skip_special_tokens (as in Qwen2.5); chat markers do not.
    kept = tokenizer.decode(
        tokenizer.encode("<|im_start|>a<tool_call>b<|im_end|>"), skip_special_tokens=True
    )
    assert kept == "a<tool_call>b"


def test_learned_merges_shorten_chats_but_never_merge_digits() -> None:
    require("transformers")
    from agentgym.engine.tiny import make_tokenizer, sample_tool_chats

    merged, plain = make_tokenizer(merges=300), make_tokenizer()
    chat = sample_tool_chats(count=1)[0]
    ids = merged.encode(chat, add_special_tokens=False)
    assert merged.decode(ids) == chat
    assert len(ids) * 2 < len(plain.encode(chat, add_special_tokens=False))
    text = "The answer is 1776; 37 * 48 = 1776 in 2024, x9y 0.5"
    pieces = merged.convert_ids_to_tokens(merged.encode(text, add_special_tokens=False))
    assert all(len(p.lstrip("Ġ")) <= 1 for p in pieces if any(c.isdigit() for c in p)), pieces
    assert merged.encode("0123456789", add_special_tokens=False) == list(b"0123456789")
    assert "Ġanswer" in pieces  # a word of the corpus is one token
    assert make_tokenizer(merges=300).get_vocab() == merged.get_vocab()  # seeded corpus


def test_chat_template_renders_tools_calls_and_results(tokenizer) -> None:
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nSolve it.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]) in text
    hermes = get_parser("hermes")
    assert (
        "<|im_start|>assistant\n" + hermes.render("Let me compute.", CALLS) + "<|im_end|>\n" in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\n1776\n</tool_response>\n"
        "<tool_response>\n2\n</tool_response><|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\nThe answer is 1776.<|im_end|>\n")
    assert "# Tools" not in tokenizer.apply_chat_template(CONVERSATION, tokenize=False)


def test_chat_template_history_is_a_prefix(tokenizer) -> None:
    """Prompt + the assistant's text + <|im_end|> is exactly how the next prompt starts."""
    prompt = tokenizer.apply_chat_template(
        CONVERSATION[:2], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    completion = get_parser("hermes").render("Let me compute.", CALLS)
    later = tokenizer.apply_chat_template(CONVERSATION[:4], tools=TOOLS, tokenize=False)
    assert later.startswith(prompt + completion + "<|im_end|>\n")


def test_transformers_loads_and_generates(tiny_model_dir, tokenizer) -> None:
    torch = require("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompt = tokenizer.apply_chat_template(
        CONVERSATION[:2], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        again = model.generate(**prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    n = prompt["input_ids"].shape[1]
    assert out.shape == (1, n + 8)
    assert torch.equal(out, again)
    assert int(out[0, n:].max()) < len(tokenizer)  # no ids beyond the tokenizer


def test_compact_template_is_short_and_keeps_history_as_a_prefix(tmp_path) -> None:
    require("transformers")
    from transformers import AutoTokenizer

    from agentgym.engine.tiny import build_tokenizer

    compact = AutoTokenizer.from_pretrained(build_tokenizer(tmp_path, tools_style="compact"))
    text = compact.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert "# Tools\ncalculate(expression: string): Evaluate an arithmetic expression." in text
    prompt = compact.apply_chat_template(
        CONVERSATION[:2], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    completion = get_parser("hermes").render("Let me compute.", CALLS)
    later = compact.apply_chat_template(CONVERSATION[:4], tools=TOOLS, tokenize=False)
    assert later.startswith(prompt + completion + "<|im_end|>\n")
    assert len(compact.encode(prompt)) < 150


def test_presets_build_and_unknown_preset_is_a_config_error(tmp_path) -> None:
    require("torch")
    from agentgym.engine.tiny import PRESETS, build_preset

    path = build_preset("quickstart", seed=1, out_dir=tmp_path / "q")
    config = json.loads((path / "config.json").read_text())
    assert config["num_hidden_layers"] == PRESETS["quickstart"]["num_layers"]
    assert config["head_dim"] >= 32
    with pytest.raises(ConfigError, match="presets"):
        build_preset("huge")
