"""Where a policy's model comes from (a folder or a hub id), and the context it can take.

Why: transformers and vLLM read any string that is not a folder as a hub id, so a mistyped
path failed with "Repo id must use alphanumeric chars" (or a download attempt) instead of
saying the folder is wrong. And vLLM refuses a context longer than the model's positions at
engine start, reported as an infrastructure failure; past them a model's output is garbage.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

from .._errors import ConfigError

#: The context window a policy gets when none is asked for (or the model's, when shorter).
DEFAULT_MAX_MODEL_LEN = 4096
#: RoPE types whose ``max_position_embeddings`` already counts their scaling, so vLLM does not
#: multiply it by ``factor`` (``_get_and_verify_max_len`` in ``vllm/config/model.py``).
_PRESCALED_ROPE = frozenset(
    {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
)


#: How a model's weights are stored, as transformers and vLLM find them: one file or more of
#: the suffix, or the shards an index names.
_WEIGHT_FORMATS = ((".safetensors", "model.safetensors.index.json"),
                   (".bin", "pytorch_model.bin.index.json"))  # fmt: skip
#: Files a tokenizer loads from; a folder with none of them has no tokenizer.
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json",
                    "vocab.txt")  # fmt: skip


def require_model_folder(model_dir: str | os.PathLike[str]) -> Path:
    """``model_dir`` as a path; it must hold a model: ``config.json``, weights, a tokenizer.

    Why weights and tokenizer: a folder without weights failed with an 81-line traceback
    under transformers and after a minute's engine start under vLLM (an infrastructure error,
    retried by the queue); one without tokenizer files was told its vocabulary is missing
    beside a tokenizer_config.json it did not have either. Only file names are looked at.
    """
    path = Path(model_dir).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{os.fspath(model_dir)} is not a model folder (no config.json); pass the folder "
            "that holds the model's config.json and weights"
        )
    if missing := model_folder_problem(path):
        raise ConfigError(
            f"{os.fspath(model_dir)} is not a whole model folder: {missing}; copy the whole "
            "model folder (config.json, weights and tokenizer files)"
        )
    return path


def model_folder_problem(path: Path) -> str:
    """What of its weights and tokenizer the model folder ``path`` lacks ("" when whole)."""
    return "; ".join(filter(None, [_weights_problem(path), _tokenizer_problem(path)]))


def _weights_problem(path: Path) -> str:
    """What keeps the weights in ``path`` from loading; "" when one format of them is whole."""
    problems = [_format_problem(path, suffix, index) for suffix, index in _WEIGHT_FORMATS]
    if "" in problems:
        return ""
    return next(filter(None, problems), "no weights (no *.safetensors or *.bin file)")


def _format_problem(path: Path, suffix: str, index: str) -> str | None:
    """Empty when ``path`` holds weights of one format whole, None when it holds none.

    With an index every shard it names must be there: vLLM loads only those.
    """
    if (path / index).is_file():
        return _index_problem(path / index)
    return "" if any(file.is_file() for file in path.glob(f"*{suffix}")) else None


def _index_problem(index: Path) -> str:
    """Why the shards ``index`` names cannot all be loaded ("" when each is there)."""
    try:
        shards = {str(shard) for shard in json.loads(index.read_text())["weight_map"].values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        shards = set()
    if not shards:
        return f"{index.name} names no shards (no readable weight_map)"
    absent = sorted(shard for shard in shards if not (index.parent / shard).is_file())
    if absent:
        return (
            f"{len(absent)} of the {len(shards)} shards {index.name} names are missing "
            f"({absent[0]} ...)"
        )
    return ""


def _tokenizer_problem(path: Path) -> str:
    """What ``path`` lacks of a tokenizer ("" when it holds one of its files)."""
    if any((path / name).is_file() for name in _TOKENIZER_FILES):
        return ""
    return f"no tokenizer files (none of {', '.join(_TOKENIZER_FILES)})"


def model_source(model: str | os.PathLike[str]) -> str:
    """``model`` as transformers and vLLM take it: a checked local folder, or a hub id.

    A string that names an existing path, or starts like one (``/``, ``.``, ``~``), is a
    local folder and must hold a model; ``tiny`` / ``tiny:PRESET`` is the project's own model
    (built offline, cached), as ``train`` and ``eval --model-path`` name it; anything else is
    left to the hub (``VLLMPolicy("tiny")`` asked the hub for a model named tiny).
    """
    from .tiny import tiny_model_folder

    text = os.fspath(model)
    if tiny := tiny_model_folder(text):
        return str(tiny)
    if _names_a_path(text):
        return str(require_model_folder(text))
    return text


def check_model_name(model: str | os.PathLike[str]) -> None:
    """Refuse what `model_source` would refuse, without building or loading a model.

    Why: a queued job is checked when it is submitted (`agentgym.runs.check_job`); a mistyped
    folder found by its worker later is a run lost, and building ``tiny`` there costs seconds.
    """
    from .tiny import tiny_preset

    text = os.fspath(model)
    if tiny_preset(text) is None and _names_a_path(text):
        require_model_folder(text)


def _names_a_path(text: str) -> bool:
    """A model name that names a local folder: an existing path, or one that starts like one."""
    return text.startswith(("/", ".", "~")) or Path(text).exists()


def context_length(model: str | os.PathLike[str], max_model_len: int | None) -> int:
    """``max_model_len`` checked against a local model's positions, as vLLM counts them.

    None gives `DEFAULT_MAX_MODEL_LEN`, or the model's limit where that is shorter. A hub id
    (no local config) and vLLM's own escape hatch, ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``, are
    not checked. Raises `ConfigError` for a longer one, naming the limit.
    """
    if max_model_len is not None and (
        not isinstance(max_model_len, int) or isinstance(max_model_len, bool) or max_model_len < 1
    ):  # vLLM refused it only once its engine had started, as an engine failure
        raise ConfigError(
            f"max_model_len must be an int >= 1 (the context window in tokens) or None for "
            f"the model's own, got {max_model_len!r}"
        )
    limit = _position_limit(Path(model) / "config.json")
    if limit is None:
        return DEFAULT_MAX_MODEL_LEN if max_model_len is None else max_model_len
    longest, why = limit
    if max_model_len is None:
        return min(DEFAULT_MAX_MODEL_LEN, longest)
    if max_model_len > longest:
        raise ConfigError(
            f"max_model_len={max_model_len} exceeds the {why} of the model in "
            f"{os.fspath(model)} (its config.json); lower max_model_len to {longest} or less"
        )
    return max_model_len


def _position_limit(config_path: Path) -> tuple[int, str] | None:
    """(the longest context, how it follows from the config), or None when not known."""
    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").lower() in ("1", "true"):
        return None
    try:
        spec = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return None
    spec = {**spec, **spec.get("text_config", {})}  # multimodal configs nest the text model
    positions = spec.get("max_position_embeddings")
    if not isinstance(positions, int):
        return None
    factor = 1.0 if "gemma3" in str(spec.get("model_type")) else _rope_factor(spec)
    longest = int(positions * factor)
    scaled = f" x RoPE factor {factor:g} = {longest}" if longest != positions else ""
    return longest, f"max_position_embeddings={positions}{scaled}"


def _rope_factor(spec: dict[str, Any]) -> float:
    """The factor vLLM scales ``max_position_embeddings`` by (1.0 for most models)."""
    rope = spec.get("rope_scaling") or spec.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        return 1.0
    per_layer_type = [v for v in rope.values() if isinstance(v, dict)]
    factor = 1.0
    for params in per_layer_type or [rope]:
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in _PRESCALED_ROPE and isinstance(params.get("factor"), (int, float)):
            factor = float(params["factor"])
    return factor


def generation_eos_ids(model: str | os.PathLike[str]) -> frozenset[int]:
    """The ``eos_token_id`` s of a model's ``generation_config.json`` (none when it has none).

    Why: vLLM stops a request on these as well as on the tokenizer's EOS (Qwen2.5-Instruct
    lists ``<|endoftext|>`` beside ``<|im_end|>``), so a policy that stopped only on the
    tokenizer's would sample past a token vLLM ends on. Read from a local folder or the hub
    cache; never downloads.
    """
    path = _generation_config_file(os.fspath(model))
    try:
        eos = json.loads(path.read_text()).get("eos_token_id") if path else None
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, not an object
        return frozenset()
    ids = [eos] if isinstance(eos, int) else eos if isinstance(eos, list) else []
    return frozenset(i for i in ids if isinstance(i, int) and not isinstance(i, bool))


def _generation_config_file(model: str) -> Path | None:
    """``generation_config.json`` of a local model folder, or of a hub id already cached."""
    if not model:
        return None
    local = Path(model) / "generation_config.json"
    if local.is_file():
        return local
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model, "generation_config.json")
    except ValueError:  # neither a folder nor a repo id
        return None
    return Path(cached) if isinstance(cached, str) else None


def read_adapter_config(adapter: str | os.PathLike[str]) -> dict[str, Any]:
    """A PEFT adapter folder's ``adapter_config.json``, once the folder is seen to be whole.

    Why: vLLM found a folder without weights, with truncated weights or with a config that
    is not JSON only inside its engine (after its start, a minute on two cores), printed
    some 75 lines of worker tracebacks and reported an infrastructure error; the eval CLI
    printed a traceback. Each is the folder's fault, named here with the fix.
    """
    folder = Path(adapter)
    config = folder / "adapter_config.json"
    if not config.is_file():
        raise ConfigError(f"{adapter} is not a PEFT adapter folder (no adapter_config.json)")
    resave = "save the adapter again (PEFT's save_pretrained)"
    try:
        spec = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config} cannot be read as JSON ({exc}); {resave}") from exc
    if not isinstance(spec, dict):
        raise ConfigError(f"{config} holds a {type(spec).__name__}, not an object; {resave}")
    weights = folder / "adapter_model.safetensors"
    if weights.is_file():
        if not _safetensors_whole(weights):
            raise ConfigError(f"{weights} is cut short or not safetensors; {resave}")
    elif not (folder / "adapter_model.bin").is_file():
        raise ConfigError(
            f"{adapter} holds no adapter weights (adapter_model.safetensors); {resave}"
        )
    return spec


def _safetensors_whole(file: Path) -> bool:
    """Whether a safetensors file is as long as its header says (no weights are read)."""
    try:
        with open(file, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            if not 0 < size < 100_000_000:
                return False
            header = json.loads(handle.read(size))
        ends = [e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"]
        return file.stat().st_size >= 8 + size + max(ends, default=0)
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False


def adapter_rank(adapter: str | os.PathLike[str]) -> int | None:
    """The largest LoRA rank of a PEFT adapter folder (``r``, ``rank_pattern``); None if unread."""
    try:
        return spec_rank(json.loads((Path(adapter) / "adapter_config.json").read_text()))
    except (OSError, ValueError):
        return None


def spec_rank(spec: dict[str, Any]) -> int | None:
    """The largest LoRA rank an ``adapter_config.json`` gives; None if it gives none."""
    try:
        return max(int(r) for r in [spec["r"], *(spec.get("rank_pattern") or {}).values()])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def check_adapter_base(
    adapter: str | os.PathLike[str],
    model: str | os.PathLike[str],
    spec: dict[str, Any] | None = None,
) -> None:
    """Refuse a LoRA adapter whose layers do not fit the model's (trained on another model).

    Why: vLLM failed such a load deep in its engine (a shape error, or a layer it has not),
    and transformers had already added the adapter's layers to the model when it failed.
    Compared from the safetensors headers alone (no weights read): every ``lora_A`` must take
    its base layer's input width and every ``lora_B`` give its output width. Adapters or
    models not stored as safetensors are not checked. ``spec``: the adapter's config, when the
    caller has read it (a sync's load reads it once).
    """
    lora = _safetensors_shapes([Path(adapter) / "adapter_model.safetensors"])
    _check_rank_said(adapter, lora, adapter_rank(adapter) if spec is None else spec_rank(spec))
    base = _model_shapes(str(Path(model)), _stamp(Path(model)))
    if not lora or not base:
        return
    for key, shape in lora.items():
        for part, axis in ((".lora_A.weight", 1), (".lora_B.weight", 0)):
            if key.endswith(part) and len(shape) == 2:
                problem = _misfit(key[: -len(part)].removeprefix("base_model.model."), shape,
                                  axis, base)  # fmt: skip
                if problem:
                    raise ConfigError(
                        f"the adapter at {os.fspath(adapter)} does not fit the model in "
                        f"{os.fspath(model)}: {problem}; it was trained on another base "
                        "model: load an adapter trained on this one"
                    )


def check_same_weights(served: str | os.PathLike[str], new: str | os.PathLike[str]) -> None:
    """Refuse a model folder whose weights a running engine cannot take in place of ``served``.

    An in-place reload copies tensors into the engine's parameters and keeps its config, so
    every weight must exist with the same shape; a folder that cannot be read this way (not
    safetensors) is refused too, since nothing would show a misfit before the engine's copy.
    """
    before = _model_shapes(str(Path(served)), _stamp(Path(served)))
    after = _model_shapes(str(Path(new)), _stamp(Path(new)))
    if not after:
        raise ConfigError(f"{os.fspath(new)} has no safetensors weights to reload from")
    misfits = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if misfits:
        key = misfits[0]
        raise ConfigError(
            f"the weights in {os.fspath(new)} do not fit the served model {os.fspath(served)} "
            f"({key}: {after.get(key, 'missing')} vs {before.get(key, 'missing')}, "
            f"{len(misfits)} tensor(s) differ); reload only a fine-tune of the served model"
        )


def _check_rank_said(
    adapter: str | os.PathLike[str], lora: dict[str, list[int]], said: int | None
) -> None:
    """Refuse LoRA weights of a higher rank than ``adapter_config.json`` gives (``said``).

    Why: the engine reserves ranks by the config, so such a folder passed every check and
    failed inside vLLM's worker ("size of tensor a (8) must match ... (16)"), 75 lines.
    """
    held = max((shape[0] for key, shape in lora.items()
                if key.endswith(".lora_A.weight") and len(shape) == 2), default=None)  # fmt: skip
    if held is not None and said is not None and held > said:
        raise ConfigError(
            f"the adapter at {os.fspath(adapter)} holds LoRA weights of rank {held}, but its "
            f"adapter_config.json gives rank {said}; save config and weights together (PEFT's "
            "save_pretrained)"
        )


def _misfit(module: str, shape: list[int], axis: int, base: dict[str, list[int]]) -> str:
    """Why a LoRA matrix of ``module`` does not fit the base weights, or "".

    "" also when the names do not say (a tied ``lm_head`` has no weight of its own).
    """
    weight = base.get(f"{module}.weight")
    if weight is not None:
        if len(weight) != 2 or weight[axis] == shape[axis]:
            return ""
        side = "input" if axis == 1 else "output"
        return f"its {module} has {side} width {shape[axis]}, the model's has {weight[axis]}"
    layer = re.match(r"(.*\blayers\.)(\d+)\.", module)
    if layer is None or not any(name.startswith(layer[1]) for name in base):
        return ""
    if any(name.startswith(f"{layer[1]}{layer[2]}.") for name in base):
        return ""
    count = len({name[len(layer[1]) :].split(".")[0] for name in base if name.startswith(layer[1])})
    return f"it adapts layer {layer[2]}, and the model has {count} layers"


def _stamp(model: Path) -> tuple[int, ...]:
    """When the model's weight files last changed (a folder rebuilt in place is read again)."""
    stamps = []
    for name in ("model.safetensors", "model.safetensors.index.json"):
        try:
            stamps.append((model / name).stat().st_mtime_ns)
        except OSError:
            stamps.append(0)
    return tuple(stamps)


@functools.lru_cache(maxsize=8)
def _model_shapes(folder: str, stamp: tuple[int, ...]) -> dict[str, list[int]]:
    """Weight shapes of a local safetensors model (one file or an index of shards).

    Cached per folder and ``stamp``: a trainer loads an adapter every step.
    """
    model = Path(folder)
    index = model / "model.safetensors.index.json"
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        shards = ["model.safetensors"]
    return _safetensors_shapes([model / shard for shard in shards])


def _safetensors_shapes(files: list[Path]) -> dict[str, list[int]]:
    """Tensor shapes from safetensors headers; empty when a file is missing or unreadable."""
    shapes: dict[str, list[int]] = {}
    for file in files:
        try:
            with open(file, "rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                if not 0 < size < 100_000_000:
                    return {}
                header = json.loads(handle.read(size))
        except (OSError, ValueError):
            return {}
        if not isinstance(header, dict):
            return {}
        for name, entry in header.items():
            if isinstance(entry, dict) and isinstance(entry.get("shape"), list):
                shapes[name] = entry["shape"]
    return shapes


def _text_config(model: str | os.PathLike[str]) -> dict[str, Any]:
    """A local model's config.json, its ``text_config`` merged in; {} when unread (a hub id)."""
    try:
        spec = json.loads((Path(model) / "config.json").read_text())
        return {**spec, **spec.get("text_config", {})}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def config_vocab_size(model: str | os.PathLike[str]) -> int | None:
    """A local model's ``vocab_size`` (the rows of its output layer); None when not given."""
    size = _text_config(model).get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def config_head_size(model: str | os.PathLike[str]) -> int | None:
    """A local model's attention head size from its config.json; None when not plain to see.

    ``head_dim`` if given, else ``hidden_size / num_attention_heads``; None for a hub id, an
    unreadable config, or latent attention (MLA's ``kv_lora_rank``), whose size vLLM derives.
    """
    spec = _text_config(model)
    if not spec or spec.get("kv_lora_rank") is not None:
        return None
    head = spec.get("head_dim")
    if isinstance(head, int) and not isinstance(head, bool):
        return head
    hidden, heads = spec.get("hidden_size"), spec.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None
