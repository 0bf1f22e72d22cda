"""Tiny local models and tokenizers, built on the spot, for tests, examples and quickstarts.

Why this exists: the machines this project runs on have no model hub, so every test and the
quickstart need a model that can be *built* offline, deterministically, in seconds. A byte-level
tokenizer (one token per byte, so every digit is its own token: merged digits made a tiny model
unable to learn to copy numbers) plus a randomly initialised, Qwen2-shaped model is enough for
vLLM and transformers to load, serve and train.

- `build_tokenizer(out_dir)` writes a tokenizer whose ids 0-255 are the bytes, followed by the
  chat special tokens, with a ChatML chat template in Qwen2.5's style (tools in the system turn,
  tool calls in hermes format, tool results as ``<tool_response>`` in a user turn).
- `build_tiny_model()` writes model + tokenizer into a cache folder keyed by a hash of the config
  (``~/.cache/agentgym/tiny/<hash>``, or ``$AGENTGYM_CACHE/tiny/<hash>``) and reuses it when
  present. Same arguments, same weights. Processes building one folder at once (torchrun's
  ranks) take turns on a file lock: one builds, the others reuse its build.
- `random_lora_model()` / `save_random_adapter()`: a non-zero LoRA on such a model, for tests
  and benchmarks of adapter loading and syncing.

Example::

    from agentgym.engine.tiny import build_tiny_model
    path = build_tiny_model()          # ~1 s the first time, then a cache hit
    # python -m vllm.entrypoints.openai.api_server --model {path} ...

torch and transformers are imported inside the functions, so importing this module is free.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Bump when the tokenizer, template or model layout changes, so old caches are not reused.
FORMAT_VERSION = 3

#: File written last into a model folder: the spec it was built from (marks a complete build).
MARKER = "agentgym_tiny.json"
#: What transformers and vLLM load from a build besides the tokenizer.
_MODEL_FILES = ("config.json", "model.safetensors")

#: Special tokens (skipped by ``decode(skip_special_tokens=True)``), after the 256 byte ids.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Added tokens that stay in decoded text (as in Qwen2.5, so tool calls survive decoding).
TOOL_TOKENS = ("<tool_call>", "</tool_call>")


def chat_template(tools_style: str = "full") -> str:
    r"""The ChatML chat template (Qwen2.5 style), with tools rendered in the system turn.

    Args:
        tools_style: ``"full"`` renders each tool schema as JSON plus the call-format
            instructions (as Qwen2.5 does; ~470 tokens for the calculator's one tool);
            ``"compact"`` renders one line per tool, ``name(arg: type, ...): description``
            (~70 tokens): short prompts make every rollout and training step cheaper, and a
            model that learns the call format from SFT needs no format instructions.

    Both styles keep history as a token prefix: a rendered conversation is the previous
    render + the assistant's text + ``<|im_end|>\n`` + the next messages.
    """
    if tools_style not in _TOOLS_BLOCKS:
        raise ValueError(f"tools_style must be one of {sorted(_TOOLS_BLOCKS)}, got {tools_style!r}")
    return _TEMPLATE_HEAD + _TOOLS_BLOCKS[tools_style] + _TEMPLATE_TAIL


_TEMPLATE_HEAD = (
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system = messages[0].content %}{%- set rest = messages[1:] %}"
    "{%- else %}"
    "{%- set system = 'You are a helpful assistant.' %}{%- set rest = messages %}"
    "{%- endif %}"
    "{{- '<|im_start|>system\\n' + system }}"
)
_TOOLS_BLOCKS = {
    "full": (
        "{%- if tools %}"
        "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions. "
        "Their signatures are within <tools></tools>:\\n<tools>' }}"
        "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
        "{{- '\\n</tools>\\n\\nFor each call, return a JSON object within "
        "<tool_call></tool_call> tags:\\n<tool_call>\\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>\' }}'
        "{%- endif %}"
    ),
    "compact": (
        "{%- if tools %}"
        "{{- '\\n\\n# Tools' }}"
        "{%- for tool in tools %}"
        "{%- set fn = tool.function if tool.function is defined else tool %}"
        "{{- '\\n' + fn.name + '(' }}"
        "{%- for name, spec in ((fn.parameters or {}).properties or {}).items() %}"
        "{{- (', ' if not loop.first else '') + name + ': ' + (spec.type or 'any') }}"
        "{%- endfor %}"
        "{{- ')' }}"
        "{%- if fn.description %}{{- ': ' + fn.description.split('\\n')[0] }}{%- endif %}"
        "{%- endfor %}"
        "{%- endif %}"
    ),
}
_TEMPLATE_TAIL = (
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in rest %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for call in (message.tool_calls or []) %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' }}'
    "{%- if fn.arguments is string %}{{- fn.arguments }}"
    "{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or rest[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or rest[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _byte_alphabet() -> list[str]:
    """The printable stand-in character of each byte 0..255 (the GPT-2 byte-level mapping)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def make_tokenizer(
    extra_special_tokens: tuple[str, ...] = (), tools_style: str = "full", merges: int = 0
) -> Any:
    """An in-memory `transformers.PreTrainedTokenizerFast`: ids 0-255 are bytes, then specials.

    Args:
        extra_special_tokens: more added tokens kept in decoded text (e.g. ``"[TOOL_CALLS]"``,
            ``"<|python_tag|>"`` for other tool-call formats), after `TOOL_TOKENS`.
        tools_style: how the chat template renders tools (see `chat_template`).
        merges: at most this many BPE merges, learned from `sample_tool_chats` (ids from
            256, before the specials); 0 keeps one token per byte. With merges, words and
            JSON punctuation become single tokens (a calculator conversation shrinks ~3x, so
            every step is cheaper) while each digit stays its own token (a tiny model cannot
            learn to copy merged numbers).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if merges:
        learned = _learn_merges(merges, tools_style)
        for left, right in learned:
            vocab[left + right] = len(vocab)
        backend = Tokenizer(models.BPE(vocab=vocab, merges=learned))
        backend.pre_tokenizer = _words_and_single_digits()
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    backend.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t in (*TOOL_TOKENS, *extra_special_tokens)
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template(tools_style),
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )


def _words_and_single_digits() -> Any:
    """GPT-2 style word splitting, with every digit a pre-token of its own (never merged)."""
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def sample_tool_chats(tools_style: str = "full", count: int = 200) -> list[str]:
    """Arithmetic tool-call chats rendered with the chat template: the tokenizer's corpus.

    The quickstart model is trained for the calculator env, so its tokenizer learns its merges
    from that domain (system prompts, a ``calculate`` tool, hermes tool calls, results,
    answers), the way a real model's tokenizer is trained on its own corpus. Seeded: the
    same text, the same merges, on every machine.
    """
    import operator
    import random

    apply = {"+": operator.add, "-": operator.sub, "*": operator.mul}
    renderer = make_tokenizer(tools_style=tools_style)
    tool = {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression exactly.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
    systems = (
        "Use the calculate tool, then give the number.",
        "You are a careful assistant. Use the calculate tool for arithmetic, "
        "then reply with the final number.",
    )
    rng = random.Random(0)
    chats = []
    for i in range(count):
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-*")
        expression, result = f"{a} {op} {b}", apply[op](a, b)
        call = {"name": "calculate", "arguments": {"expression": expression}}
        messages = [
            {"role": "system", "content": systems[i % len(systems)]},
            {"role": "user", "content": f"What is {expression}?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
            {"role": "tool", "content": str(result)},
            {"role": "assistant", "content": f"The answer is {result}."},
        ]
        chats.append(str(renderer.apply_chat_template(messages, tools=[tool], tokenize=False)))
    return chats


def _learn_merges(count: int, tools_style: str) -> list[tuple[str, str]]:
    """The first ``count`` BPE merges of `sample_tool_chats`, in the order they were learned."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = _words_and_single_digits()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + count,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[*SPECIAL_TOKENS, *TOOL_TOKENS],
        show_progress=False,
    )
    learner.train_from_iterator(sample_tool_chats(tools_style), trainer)
    merges = json.loads(learner.to_str())["model"]["merges"]
    pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    return [(left, right) for left, right in pairs][:count]


def build_tokenizer(
    out_dir: str | os.PathLike[str],
    extra_special_tokens: tuple[str, ...] = (),
    tools_style: str = "full",
) -> Path:
    """Write the byte-level tokenizer (see `make_tokenizer`) to ``out_dir``; returns the path."""
    out = Path(out_dir)
    make_tokenizer(extra_special_tokens, tools_style).save_pretrained(out)
    return out


def cache_root() -> Path:
    """``$AGENTGYM_CACHE`` if set, else ``~/.cache/agentgym``."""
    env = os.environ.get("AGENTGYM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "agentgym"


def build_tiny_model(
    out_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 256,
    max_position_embeddings: int = 4096,
    tools_style: str = "full",
    merges: int = 0,
) -> Path:
    """Build (or reuse) a random Qwen2-style model with the byte tokenizer; returns its folder.

    Args:
        out_dir: where to write it; ``None`` means ``cache_root()/tiny/<hash of the arguments>``.
            A folder that already holds a complete build of the same arguments is reused as is.
        seed: torch seed for the initial weights: same seed and shape, same weights.
        hidden_size: model width; ``hidden_size / num_heads`` (head_dim) must be an integer of
            at least 32, and 64 is safest (vLLM's CPU attention rejects head_dim 16).
        num_layers: decoder layers.
        num_heads: attention heads.
        num_kv_heads: key/value heads (grouped-query attention); divides ``num_heads``.
        intermediate_size: MLP width.
        max_position_embeddings: longest sequence the rotary embedding is sized for.
        tools_style: how the chat template renders tools, ``"full"`` or ``"compact"`` (see
            `chat_template`).
        merges: learned BPE merges of the tokenizer (see `make_tokenizer`); 0: bytes only.

    Raises:
        ConfigError: the shape is invalid (a size < 1, head_dim < 32 or not an integer, or
            num_heads not a multiple of num_kv_heads).
    """
    from .._errors import ConfigError

    sizes = (
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        intermediate_size,
        max_position_embeddings,
    )
    if tools_style not in _TOOLS_BLOCKS:
        raise ConfigError(
            f"tools_style must be one of {sorted(_TOOLS_BLOCKS)}, got {tools_style!r}"
        )
    if min(sizes) < 1 or merges < 0:
        raise ConfigError(
            f"tiny model sizes must be >= 1, got hidden_size={hidden_size}, "
            f"num_layers={num_layers}, num_heads={num_heads}, num_kv_heads={num_kv_heads}, "
            f"intermediate_size={intermediate_size}, "
            f"max_position_embeddings={max_position_embeddings}, merges={merges} (>= 0)"
        )
    head_dim, rem = divmod(hidden_size, num_heads)
    if rem or head_dim < 32 or num_heads % num_kv_heads:
        raise ConfigError(
            f"tiny model shape hidden_size={hidden_size}, num_heads={num_heads}, "
            f"num_kv_heads={num_kv_heads}: need hidden_size = num_heads * head_dim with "
            "head_dim >= 32 (vLLM's CPU attention needs it; 64 is safest) and num_heads a "
            "multiple of num_kv_heads"
        )
    spec = {
        "format": FORMAT_VERSION,
        "seed": seed,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "intermediate_size": intermediate_size,
        "max_position_embeddings": max_position_embeddings,
        "tools_style": tools_style,
        "merges": merges,
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    out = Path(out_dir) if out_dir is not None else cache_root() / "tiny" / digest
    if _is_build_of(out, spec):
        return out
    with _build_lock(out):
        if _is_build_of(out, spec):  # another process built it while this one waited
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            _write_model(tmp, spec)
            (tmp / MARKER).write_text(json.dumps(spec, sort_keys=True))
            if out.exists():  # an incomplete or different build: replace it
                shutil.rmtree(out)
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@contextlib.contextmanager
def _build_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on building ``out``, across processes.

    torchrun's ranks all build the same cached model at once. Without the lock, a rank that
    found no build yet could delete the complete one another rank had just renamed into
    place, while that rank was loading it. The lock file stays beside the folder (removing it
    would let a third process lock a different file of the same name).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _is_build_of(out: Path, spec: dict[str, Any]) -> bool:
    """True when ``out`` holds a complete build of ``spec`` (its marker is written last).

    The model files are looked for too: a build made on a torch.distributed rank other than 0
    before `_save_model_files` has the marker and no model (transformers wrote none there).
    """
    try:
        marked = json.loads((out / MARKER).read_text()) == spec
    except (OSError, ValueError):
        return False
    return marked and all((out / name).is_file() for name in _MODEL_FILES)


def _write_model(out: Path, spec: dict[str, Any]) -> None:
    """Save the tokenizer, config, generation config and seeded weights into ``out``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = make_tokenizer(tools_style=spec["tools_style"], merges=spec["merges"])
    tokenizer.save_pretrained(out)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(  # type: ignore[call-arg]  # head_dim is a Qwen2Config kwarg in 5.x
        vocab_size=len(tokenizer),  # exactly: padding ids would be sampled and decode to ""
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_layers"],
        num_attention_heads=spec["num_heads"],
        num_key_value_heads=spec["num_kv_heads"],
        head_dim=spec["hidden_size"] // spec["num_heads"],
        max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=True,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(spec["seed"])
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    _save_model_files(model, out)


def _save_model_files(model: Any, out: Path) -> None:
    """What ``model.save_pretrained(out)`` writes for this model, written on any process.

    transformers' ``save_pretrained`` writes nothing on a torch.distributed rank other than 0,
    and under torchrun every rank builds the model it trains: the rank that built first could
    leave a folder with a tokenizer and no model. So the config, the generation config and the
    weights are written here as transformers writes them (``architectures`` set; the tied
    ``lm_head.weight`` left out; ``format: pt`` metadata).
    """
    from safetensors.torch import save_file

    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    weights = model.state_dict()
    if model.config.tie_word_embeddings:
        del weights["lm_head.weight"]
    save_file(
        {name: t.contiguous() for name, t in weights.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )


#: Named shapes for `build_preset`. ``quickstart`` is the model `make quickstart` trains on a
#: 2-core CPU: big enough to learn the calculator's copy-the-numbers skill in a short SFT,
#: head_dim 64 (vLLM CPU attention), compact tool rendering and learned merges (a calculator
#: episode is ~100 tokens instead of ~330 bytes: every SFT step, rollout and GRPO step is
#: cheaper, and the skill emerges in fewer steps).
PRESETS: dict[str, dict[str, Any]] = {
    "test": {},
    "quickstart": {
        "hidden_size": 128,
        "num_layers": 4,
        "num_heads": 2,
        "num_kv_heads": 1,
        "intermediate_size": 512,
        "max_position_embeddings": 1024,
        "tools_style": "compact",
        "merges": 300,
    },
}


def build_preset(
    name: str = "quickstart", *, seed: int = 0, out_dir: str | os.PathLike[str] | None = None
) -> Path:
    """`build_tiny_model` with a named shape from `PRESETS`; returns the (cached) folder.

    Raises:
        ConfigError: ``name`` is not a preset.
    """
    from .._errors import ConfigError

    if name not in PRESETS:
        raise ConfigError(f"unknown tiny model preset {name!r}; presets: {sorted(PRESETS)}")
    return build_tiny_model(out_dir, seed=seed, **PRESETS[name])


def tiny_model_folder(model: str, *, seed: int = 0) -> Path | None:
    """The folder of ``tiny`` / ``tiny:PRESET`` (built offline with ``seed``, cached); else None.

    Why one function: ``train`` (``model: tiny:quickstart``) and ``eval --model-path
    tiny:quickstart`` name the project's own model the same way, and build the same one.
    """
    preset = tiny_preset(model)
    if preset is None:
        return None
    return build_preset(preset, seed=seed) if preset else build_tiny_model(seed=seed)


def tiny_preset(model: str) -> str | None:
    """The preset ``tiny:PRESET`` names ("" for ``tiny``); None for a name that is not tiny's.

    Why apart from building: a queued job's model is checked at submission, before any build.

    Raises:
        ConfigError: ``tiny:`` with a preset that is not in `PRESETS`.
    """
    from .._errors import ConfigError

    if model != "tiny" and not model.startswith("tiny:"):
        return None
    preset = model.partition(":")[2]
    if preset and preset not in PRESETS:
        raise ConfigError(f"unknown tiny model preset {preset!r}; presets: {sorted(PRESETS)}")
    return preset


def random_lora_model(
    model_dir: str | os.PathLike[str],
    *,
    rank: int = 8,
    alpha: int | None = None,
    targets: str | list[str] = "all-linear",
    seed: int = 0,
) -> Any:
    """The model in float32 with a non-zero PEFT LoRA, as an adapter looks after training.

    For tests and benchmarks of loading, syncing and serving adapters: PEFT's own start
    (B = 0) would serve exactly the base model, so no test could tell it was applied.
    ``alpha`` defaults to PEFT's (8).
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha or 8, target_modules=targets,
                        init_lora_weights=False, task_type="CAUSAL_LM")  # fmt: skip
    return get_peft_model(base, config)


def save_random_adapter(
    model_dir: str | os.PathLike[str], out: str | os.PathLike[str], **kwargs: Any
) -> Path:
    """`random_lora_model`'s adapter saved as a PEFT folder at ``out``; returns ``out``."""
    random_lora_model(model_dir, **kwargs).save_pretrained(str(out))
    return Path(out)
