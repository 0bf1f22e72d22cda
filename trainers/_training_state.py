"""The training state's files: a checkpoint's adapter, optimizer and RNG states, and the adapter.

The adapter is also what every step's sync writes for the engine, so its save is kept fast.
`RunDir` decides where these files go and when (atomically, which ones to keep); this module
only writes and reads them, so every training process can load the same checkpoint.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentgym._errors import ConfigError
from agentgym.engine._model_dir import read_adapter_config


def write_training_state(folder: Path, model: Any, optimizer: Any, state_text: str) -> None:
    """``adapter/``, ``optimizer.pt``, ``rng.pt`` and ``trainer_state.json`` into ``folder``."""
    import torch

    model.save_pretrained(folder / "adapter")
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(_rng_state(), folder / "rng.pt")
    (folder / "trainer_state.json").write_text(state_text, encoding="utf-8")


def write_failure(exc: BaseException) -> str | None:
    """``exc`` in one line when it is a failed write of a checkpoint's files, else None.

    Why: a full disk ends a save as an `OSError`, as safetensors' ``SafetensorError`` ("I/O
    error ... os error 28") or as torch's ``RuntimeError`` "[enforce fail at
    inline_container.cc:672] . unexpected pos ..." (its zip writer checks what it wrote),
    each at the end of a traceback of some 140 lines. "no space left?" is added where the
    error says so, or (torch) cannot say more.
    """
    from safetensors import SafetensorError

    text = " ".join(str(exc).split())[:200]
    written = (isinstance(exc, OSError)
               or (isinstance(exc, RuntimeError) and "inline_container" in text)
               or (isinstance(exc, SafetensorError) and "I/O error" in text))  # fmt: skip
    if not written:
        return None
    full = (getattr(exc, "errno", None) == errno.ENOSPC
            or any(sign in text for sign in ("unexpected pos", "os error 28")))  # fmt: skip
    return f"{text}; no space left?" if full else text


def load_training_state(path: str | os.PathLike[str], model: Any, optimizer: Any) -> dict:
    """Restore a checkpoint's adapter weights, optimizer and RNG states; returns trainer_state.

    Writes nothing, so every training process can load the same checkpoint. Lines of later
    steps were already moved aside when `RunDir` reopened the run (``resume=True``).

    Raises:
        ConfigError: the checkpoint is damaged, or its adapter does not fit ``model``.
    """
    import torch

    path = Path(path)
    refuse_damaged_checkpoint(path, str(path), "resume from the checkpoint before it")
    state: dict[str, Any] = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    _load_adapter_weights(model, path / "adapter")
    optimizer.load_state_dict(
        torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    )
    _set_rng_state(torch.load(path / "rng.pt", weights_only=True))
    return state


def refuse_damaged_checkpoint(folder: Path, shown: str, instead: str) -> None:
    """Refuse a checkpoint whose files cannot be loaded, naming the file; reads headers only.

    Why: a cut-short adapter or a broken ``trainer_state.json`` failed the resume with a
    traceback once the model had loaded, after a dry run had called the folder fine.
    ``shown`` names the checkpoint, ``instead`` is what deleting it lets the user do.
    """
    damage = _checkpoint_damage(folder)
    if damage is not None:
        raise ConfigError(
            f"checkpoint {shown} is damaged ({damage}); delete that folder to {instead}"
        )


def _checkpoint_damage(folder: Path) -> str | None:
    """What makes the checkpoint in ``folder`` unloadable, or None when its files are whole."""
    state = _trainer_state_damage(folder / "trainer_state.json")
    if state is not None:
        return state
    try:
        read_adapter_config(folder / "adapter")
    except ConfigError as exc:  # its message names the file by its full path, then a fix
        return str(exc).split("; ")[0].replace(f"{folder}{os.sep}", "")
    for name in ("optimizer.pt", "rng.pt"):  # torch.save writes zip archives
        if not zipfile.is_zipfile(folder / name):
            return f"its {name} is missing or cut short"
    return None


def checkpoint_step(folder: Path, fix: str) -> int:
    """The step a checkpoint's ``trainer_state.json`` records.

    Raises:
        ConfigError: the file is unreadable or holds no step number, naming it and ``fix``.
    """
    damage = _trainer_state_damage(folder / "trainer_state.json")
    if damage is not None:
        raise ConfigError(f"checkpoint {folder} is damaged ({damage}); {fix}")
    return int(json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))["step"])


def _trainer_state_damage(file: Path) -> str | None:
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"its {file.name} cannot be read: {exc}"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return f"its {file.name} holds no step number"
    return None


def _load_adapter_weights(model: Any, adapter_dir: Path) -> None:
    """Load a saved PEFT adapter's weights into ``model``'s active adapter, strictly."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    device = next(model.parameters()).device
    weights = load_peft_weights(str(adapter_dir), device=str(device))
    result: Any = set_peft_model_state_dict(model, weights)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise ConfigError(
            f"the adapter in {adapter_dir} does not fit the model (unexpected: "
            f"{result.unexpected_keys[:3]}, missing: {missing[:3]}); resume with the LoRA "
            "settings the run was started with"
        )


def save_adapter_files(model: Any, folder: Path) -> None:
    """The active PEFT adapter as vLLM reads it: weights and config, without a model card."""
    peft_config = getattr(model, "peft_config", None)
    if not peft_config:
        model.save_pretrained(folder)  # not a PEFT model: whatever it saves
        return
    name = getattr(model, "active_adapter", "default")
    layout = _adapter_layout(model, name)
    weights = {key: t.detach().contiguous() for key, t in layout.tensors(model).items()}
    _save_safetensors(weights, folder / "adapter_model.safetensors")
    if layout.config_json is None:
        peft_config[name].save_pretrained(str(folder))
        layout.config_json = (folder / "adapter_config.json").read_text()
    else:
        (folder / "adapter_config.json").write_text(layout.config_json)


def _save_safetensors(weights: dict[str, Any], file: Path) -> None:
    """``safetensors`` file of ``weights``; CPU float32/float16 ones go through its numpy front end.

    Both front ends write the same bytes, but safetensors 0.8's torch one builds a ctypes view
    per tensor: 1.08 ms vs 0.62 ms for the tiny model's 28 LoRA tensors, whose whole sync
    takes ~4 ms. Other dtypes (bfloat16: numpy has none) and GPU tensors take the torch one.
    """
    import torch

    fast = (torch.float32, torch.float16)
    if all(t.device.type == "cpu" and t.dtype in fast for t in weights.values()):
        from safetensors.numpy import save_file as save_numpy

        save_numpy({k: t.numpy() for k, t in weights.items()}, str(file), metadata={"format": "pt"})
    else:
        from safetensors.torch import save_file

        save_file(weights, str(file), metadata={"format": "pt"})


@dataclasses.dataclass
class _AdapterLayout:
    """What saving one model's adapter writes, worked out once: every sync saves it again.

    PEFT's ``get_peft_model_state_dict`` re-reads the base model's config on each call (to
    decide whether embeddings belong in the file) and walks every module: ~3 ms of the ~5 ms
    save on the tiny model. Its keys map to live parameters (the optimiser updates them in
    place), so later saves read those directly. A key that is not a parameter's storage
    leaves ``params`` empty and every save asks PEFT again.
    """

    adapter: str
    params: dict[str, Any]  # saved key -> the model's parameter holding it
    config_json: str | None = None  # adapter_config.json as PEFT wrote it the first time

    def tensors(self, model: Any) -> dict[str, Any]:
        if self.params:
            return self.params
        from peft import get_peft_model_state_dict

        return dict(get_peft_model_state_dict(model, adapter_name=self.adapter))


def _adapter_layout(model: Any, adapter: str) -> _AdapterLayout:
    layout: _AdapterLayout | None = getattr(model, "_agentgym_adapter_layout", None)
    if layout is not None and layout.adapter == adapter:
        return layout
    from peft import get_peft_model_state_dict

    reference = get_peft_model_state_dict(model, adapter_name=adapter)
    storage = {(p.data_ptr(), p.shape): p for p in model.parameters()}
    params = {key: storage.get((t.data_ptr(), t.shape)) for key, t in reference.items()}
    layout = _AdapterLayout(adapter, {k: p for k, p in params.items() if p is not None})
    if len(layout.params) != len(reference):
        layout.params = {}
    object.__setattr__(model, "_agentgym_adapter_layout", layout)
    return layout


def _rng_state() -> dict[str, Any]:
    """The global generators' states, in types ``torch.load(weights_only=True)`` accepts."""
    import numpy as np
    import torch

    numpy_state: Any = np.random.get_state(legacy=True)
    kind, keys, pos, has_gauss, gauss = numpy_state
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    import numpy as np
    import torch

    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(cuda)
