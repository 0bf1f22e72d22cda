"""LLM engines behind the `Policy` contract: model and backend code, kept out of the core.

Everything here imports torch, transformers or vLLM lazily (inside functions), so
``import agentgym.engine`` stays free; each class names the extra to install when its backend
is missing.

- `VLLMPolicy`: an in-process vLLM engine, token in / token out across turns, LoRA versions.
- `HFPolicy`: transformers `generate` with the same contract (and the logprob oracle).
- `ChatRenderer`: prompt deltas from a chat template, and the ``concat``/``per_turn`` decision.
- `serve_vllm` / `LocalServer`: vLLM's OpenAI-compatible server as a subprocess, for
  `OpenAIPolicy` runs on a local model folder.
- `tiny`: tiny local models and tokenizers built offline and deterministically.
"""

from __future__ import annotations

from ._episode import SamplingConfig, TokenEpisode, TokenPolicy
from ._hf import HFPolicy
from ._render import ChatRenderer, ModeDecision, TemplateError
from ._serve import LocalServer, serve_vllm
from ._vllm import AdapterVersion, VLLMPolicy

__all__ = [
    "AdapterVersion",
    "ChatRenderer",
    "HFPolicy",
    "LocalServer",
    "ModeDecision",
    "SamplingConfig",
    "TemplateError",
    "TokenEpisode",
    "TokenPolicy",
    "VLLMPolicy",
    "serve_vllm",
]
