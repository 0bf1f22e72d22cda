"""LLM engines behind the `Policy` contract: model and backend code, kept out of the core.

Everything here imports torch, transformers or vLLM lazily (inside functions), so
``import agentgym.engine`` stays free; each class names the extra to install when its backend
is missing.

- `serve_vllm` / `LocalServer`: vLLM's OpenAI-compatible server as a subprocess, for
  `OpenAIPolicy` runs on a local model folder.
- `tiny`: tiny local models and tokenizers built offline and deterministically.
"""

from __future__ import annotations

from ._serve import LocalServer, serve_vllm

__all__ = ["LocalServer", "serve_vllm"]
