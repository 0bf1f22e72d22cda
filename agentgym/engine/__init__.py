"""LLM engines behind the `Policy` contract: model and backend code, kept out of the core.

Everything here imports torch, transformers or vLLM lazily (inside functions), so
``import agentgym.engine`` stays free; each class names the extra to install when its backend
is missing.

- `VLLMPolicy`: an in-process vLLM engine, token in / token out across turns, LoRA versions.
- `HFPolicy`: transformers `generate` with the same contract (and the logprob oracle).
- `ChatRenderer`: prompt deltas from a chat template, and the ``concat``/``per_turn`` decision.
- `RemoteVLLMPolicy` + `VLLMFleet`: the same token-in/token-out contract on N vLLM servers
  (sticky least-loaded routing, or an existing router; adapter publish to every server).
- `serve_vllm` / `serve_vllm_fleet` / `serve_router` / `LocalServer`: vLLM's OpenAI-compatible
  server (one or several) and vllm-router as subprocesses, on a local model folder.
- `tiny`: tiny local models and tokenizers built offline and deterministically.
"""

from __future__ import annotations

from ._episode import AdapterVersion, SamplingConfig, TokenEpisode, TokenPolicy
from ._fleet import AdapterPublishError, PublishReport, VLLMFleet, stage_adapter
from ._hf import HFPolicy
from ._remote import RemoteVLLMPolicy
from ._render import ChatRenderer, ModeDecision, TemplateError
from ._router import StickyLeastLoaded
from ._serve import LocalServer, ServerOptions, serve_router, serve_vllm, serve_vllm_fleet
from ._vllm import VLLMPolicy

__all__ = [
    "AdapterPublishError",
    "AdapterVersion",
    "ChatRenderer",
    "HFPolicy",
    "LocalServer",
    "ModeDecision",
    "PublishReport",
    "RemoteVLLMPolicy",
    "SamplingConfig",
    "ServerOptions",
    "StickyLeastLoaded",
    "TemplateError",
    "TokenEpisode",
    "TokenPolicy",
    "VLLMFleet",
    "VLLMPolicy",
    "serve_router",
    "serve_vllm",
    "serve_vllm_fleet",
    "stage_adapter",
]
