"""A command's console for its own progress: vLLM's and transformers' warnings, minus known noise.

Why: on the CPU build every engine start prints about a dozen warnings that are expected here
and need no action (no Triton, no tcmalloc in ``LD_PRELOAD``, eager mode that agentgym chose,
deprecations of calls vLLM makes itself), and every start and stop logs INFO lines. A user
reading ``agentgym train`` or ``agentgym eval`` should see its progress and the warnings that
matter. The settings go into the environment before vLLM is imported, so the engine's spawned
processes read them too, and each setting a user made (``VLLM_LOGGING_LEVEL``,
``VLLM_LOGGING_CONFIG_PATH``, ``PYTHONWARNINGS``, ``TRANSFORMERS_VERBOSITY``) wins.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from agentgym._durable import atomic_write_text

from .tiny import cache_root

#: Parts of warnings that are expected on this project's machines and ask nothing of a user.
KNOWN_NOISE = (
    "Model Runner V2 requires Triton",  # the CPU build runs the V1 runner, as intended
    "Triton is not installed",
    "is not found in LD_PRELOAD",  # tcmalloc / iomp: a speed hint for the CPU build
    "Enforce eager set",  # agentgym starts CPU engines eager (docs/figures.md, engine start)
    # agentgym turns chunked prefill off on the CPU build; the engine tests check its tokens
    # and logprobs against transformers
    "does not officially support disabling chunked prefill",
    "Reset SSM cache type",  # a note for Mamba-style models, printed for every model
    "Inductor compilation was disabled",
    "different tokenizers for different LoRAs",  # adapters here never carry a tokenizer
    "Passing raw prompts to InputProcessor is deprecated",  # vLLM's own call path
)
#: Python warnings vLLM triggers in its own code at import (module: where it is attributed).
_NOISY_WARNINGS = "ignore::FutureWarning:vllm.triton_utils.dispatcher"


class KnownNoise(logging.Filter):
    """Drops records whose message contains one of `KNOWN_NOISE` (vLLM's handler uses it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(part in message for part in KNOWN_NOISE)


def quiet_backends() -> None:
    """VLLM at WARNING without `KNOWN_NOISE`, transformers at ERROR, for this process's engines.

    Call it before vLLM is imported (a command's first step). Configures nothing a user set.
    """
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("PYTHONWARNINGS", _NOISY_WARNINGS)
    if "VLLM_LOGGING_LEVEL" in os.environ or "VLLM_LOGGING_CONFIG_PATH" in os.environ:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        return
    os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(_logging_config_file())


def _logging_config_file() -> Path:
    """VLLM's default logging config at WARNING, its handler filtered by `KnownNoise`.

    Written once per content into the cache (a `logging.config.dictConfig` file, as
    ``VLLM_LOGGING_CONFIG_PATH`` takes it); the format is vLLM's own, so lines look the same.
    """
    text = json.dumps(_logging_config(), indent=1, sort_keys=True)
    path = cache_root() / f"vllm-logging-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    return path


def _logging_config() -> dict[str, object]:
    line = (
        f"{os.environ.get('VLLM_LOGGING_PREFIX', '')}(%(vllm_process_name)s pid=%(process)d) "
        "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"known_noise": {"()": f"{__name__}.KnownNoise"}},
        "formatters": {
            "vllm": {
                "()": "vllm.logging_utils.NewLineFormatter",
                "format": line,
                "datefmt": "%m-%d %H:%M:%S",
            }
        },
        "handlers": {
            "vllm": {
                "class": "logging.StreamHandler",
                "formatter": "vllm",
                "filters": ["known_noise"],
                "level": "WARNING",
                "stream": os.environ.get("VLLM_LOGGING_STREAM", "ext://sys.stdout"),
            }
        },
        "loggers": {"vllm": {"handlers": ["vllm"], "level": "WARNING", "propagate": False}},
    }
