"""Where a policy's model comes from: a local model folder, or a Hugging Face id.

Why: transformers and vLLM read any string that is not a folder as a hub id, so a mistyped
path failed with "Repo id must use alphanumeric chars" (or a download attempt) instead of
saying the folder is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._errors import ConfigError


def require_model_folder(model_dir: str | os.PathLike[str]) -> Path:
    """``model_dir`` as a path; it must hold a model (``config.json``)."""
    path = Path(model_dir).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{os.fspath(model_dir)} is not a model folder (no config.json); pass the folder "
            "that holds the model's config.json and weights"
        )
    return path


def model_source(model: str | os.PathLike[str]) -> str:
    """``model`` as transformers and vLLM take it: a checked local folder, or a hub id.

    A string that names an existing path, or starts like one (``/``, ``.``, ``~``), is a
    local folder and must hold a model; anything else is left to the hub.
    """
    text = os.fspath(model)
    if text.startswith(("/", ".", "~")) or Path(text).exists():
        return str(require_model_folder(text))
    return text
