"""Methods agentgym adds to vLLM's worker (vLLM's ``worker_extension_cls``).

They run where the model's tensors are, called through ``collective_rpc``
(`VLLMPolicy.reload_weights`). vLLM imports this module in its worker processes: keep it free
of heavy imports.
"""

from __future__ import annotations

from typing import Any

#: The engine argument that mixes `WorkerWeights` into vLLM's worker class.
EXTENSION = f"{__name__}.WorkerWeights"


class WorkerWeights:
    """Mixed into vLLM's worker class; ``self`` is the worker (``self.model_runner``)."""

    model_runner: Any

    def agentgym_reload_weights(self, path: str) -> None:
        """Reload the weights in place from the folder ``path``; re-prepare a tied output layer.

        Why the second part: vLLM 0.32's reload puts a layer that no file weight loads (an
        output layer tied to the embedding) back as it was, without its after-loading step;
        the CPU build keeps a packed copy of that layer's weight for its matmul, so the logits
        went on using the old embedding (a fine-tune reloaded this way sampled neither its own
        distribution nor the old model's; tests/engine/test_reload_weights.py).
        """
        self.model_runner.reload_weights(weights_path=path)
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        if tied and method is not None:
            method.process_weights_after_loading(head)
