"""`HFPolicy`: transformers `generate` behind the same token-in/token-out contract as vLLM.

For machines without vLLM, and as the oracle for vLLM's numbers in tests: `token_logprobs`
scores given tokens with a plain forward pass, the way a trainer does.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from .._errors import ConfigError
from .._types import Completion
from ._episode import ModeChoice, SamplingConfig, TokenPolicy
from ._render import ChatRenderer


class HFPolicy(TokenPolicy):
    """A `Policy` sampling with `transformers` (one turn at a time, in a worker thread).

    Args:
        model: a local model folder.
        sampling: a `SamplingConfig` or a dict of its fields (``min_p`` is not supported).
        adapter: a PEFT adapter folder to apply on top of the model, or None.
        device: ``"cpu"``, ``"cuda"`` ...
        dtype: torch dtype name for the weights (``"float32"`` for exact comparisons).
        max_model_len: context window; a longer prompt ends the episode as ``truncated``.
        chat_template_kwargs: extra chat-template variables.
        rollout_mode: see `TokenPolicy`.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        sampling: SamplingConfig | dict[str, Any] | None = None,
        adapter: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        max_model_len: int = 4096,
        chat_template_kwargs: dict[str, Any] | None = None,
        rollout_mode: ModeChoice = "auto",
    ) -> None:
        super().__init__(sampling, rollout_mode)
        if self.sampling.min_p or self.sampling.extra:
            raise ConfigError(
                "HFPolicy supports neither min_p nor extra vLLM sampling fields; "
                "drop them or use VLLMPolicy"
            )
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ConfigError(
                f"HFPolicy needs transformers: pip install 'agentgym[train]' ({exc})"
            ) from exc
        self.max_model_len = max_model_len
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        self._renderer = ChatRenderer(tokenizer, chat_template_kwargs)
        net: Any = AutoModelForCausalLM.from_pretrained(str(model), dtype=getattr(torch, dtype))
        if adapter is not None:
            from peft import PeftModel

            net = PeftModel.from_pretrained(net, str(adapter))
        self.model = net.to(device).eval()
        self.device = device
        self._lock = threading.Lock()  # one forward pass at a time; torch uses every core

    @property
    def renderer(self) -> ChatRenderer:
        """The chat-template renderer of the model's tokenizer."""
        return self._renderer

    async def generate_ids(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int | None = None,
        seed: int | None = None,
        sampling: SamplingConfig | None = None,
        session: str | None = None,
    ) -> Completion:
        """Sample one turn from exact prompt ids (in a thread: the caller's loop keeps going)."""
        s = sampling or self.sampling
        limit = self.turn_limit(prompt_ids, max_tokens, s)
        return await asyncio.to_thread(self._sample, prompt_ids, limit, seed, s)

    def _sample(
        self, prompt_ids: list[int], max_tokens: int, seed: int | None, s: SamplingConfig
    ) -> Completion:
        import torch

        tokenizer = self._renderer.tokenizer
        greedy = s.temperature == 0
        options: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "do_sample": not greedy,
            "output_scores": True,
            "return_dict_in_generate": True,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": sorted(self._renderer.stop_token_ids) or None,
        }
        if not greedy:
            options |= {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k or None}
        if s.stop:
            options |= {"stop_strings": list(s.stop), "tokenizer": tokenizer}
        with self._lock, torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            inputs = torch.tensor([prompt_ids], device=self.device)
            out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), **options)
        ids = out.sequences[0, len(prompt_ids) :].tolist()
        logprobs = [
            torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.scores, ids)
        ]
        stopped = bool(ids) and ids[-1] in self._renderer.stop_token_ids
        return Completion(
            text=self._renderer.visible_text(tokenizer.decode(ids, skip_special_tokens=False), ids),
            prompt_ids=list(prompt_ids),
            completion_ids=ids,
            logprobs=logprobs,
            finish_reason="stop" if stopped or len(ids) < max_tokens else "length",
            adapter_version=0,
        )

    def token_logprobs(
        self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """Log-probabilities of ``completion_ids`` after ``prompt_ids`` at ``temperature``.

        One forward pass over the whole sequence, as a trainer computes them: the reference
        for what a sampling engine reports.
        """
        import torch

        ids = torch.tensor([prompt_ids + completion_ids], device=self.device)
        with self._lock, torch.no_grad():
            logits = self.model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
        logp = torch.log_softmax(logits / temperature, -1)
        return logp.gather(-1, torch.tensor(completion_ids, device=self.device)[:, None])[
            :, 0
        ].tolist()
