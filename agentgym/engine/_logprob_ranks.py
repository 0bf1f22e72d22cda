"""Logprob ranks without torch.compile in vLLM-CPU engines: a fresh engine's first turn is on time.

Why: vLLM 0.32 ranks each sampled token among the vocabulary (the ``rank`` beside each
logprob it returns) with ``batched_count_greater_than``, a function under ``torch.compile``.
An engine that runs eager (agentgym's default on the CPU build) still compiles that function
with inductor on the first request asking for logprobs, and every agentgym turn asks: the
first turn of a fresh engine on the tiny model took 2.5-3.3 s instead of 0.3 s on a 2-core
machine (``python bench/engine_lifecycle_bench.py``), and 7 s with two engines starting side
by side (torchrun's two ranks). Eager, the count is one comparison and one sum, and on short
rows it is as fast: at 96 rows of 261 entries (the tiny model's vocabulary) 0.022 ms vs 0.030
ms compiled, at 2,048 entries 0.16 vs 0.06 ms, against seconds of compiling. On a real
vocabulary it is not: 66 ms vs 2.7 ms at 151,936 entries (one thread). So rows of at most
`EAGER_MAX_VOCAB` entries are counted eagerly and longer ones by vLLM's compiled function,
compiled on first use as before. agentgym never reads the rank.

How: vLLM loads ``vllm.general_plugins`` entry points in each of its processes; `register`
(agentgym's entry point) puts that choice in the compiled function's place where
``AGENTGYM_EAGER_LOGPROB_RANKS=1`` is in the environment. `enable_for_cpu_engines` sets it
for engines started from this process on the CPU build (unless already set; ``0`` keeps
vLLM's compiled count); `serve_vllm` sets it for the servers it starts. Written against
vLLM 0.32; where the function has moved, `register` logs a warning and vLLM's stays.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

log = logging.getLogger(__name__)

#: Environment switch read in vLLM's processes ("1": count eagerly).
ENV_VAR = "AGENTGYM_EAGER_LOGPROB_RANKS"
_NAME = "batched_count_greater_than"
#: Longest row (vocabulary) counted eagerly: eager costs 0.1 ms more per decode step at 2,048.
EAGER_MAX_VOCAB = 4096
#: Where vLLM defines the function, and where its sampler (imported by workers only) calls it.
_DEFINED_IN, _CALLED_FROM = "vllm.v1.sample.ops.logprobs", "vllm.v1.sample.sampler"


def enable_for_cpu_engines(env: dict[str, str] | None = None) -> None:
    """Count ranks eagerly in engines started with ``env`` (default: this process's), on CPU."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        (os.environ if env is None else env).setdefault(ENV_VAR, "1")


def count_at_least(x: Any, values: Any) -> Any:
    """Per row of ``x``, how many entries are >= that row's value: vLLM's rank, uncompiled."""
    return (x >= values).sum(-1)


def register() -> None:
    """Count short rows eagerly where the environment asks for it (vLLM's plugin hook)."""
    if os.environ.get(ENV_VAR) != "1":
        return
    try:
        defined_in = importlib.import_module(_DEFINED_IN)
    except ImportError:  # a vLLM without the V1 sampler: nothing to replace
        return
    # the sampler is patched only where it is loaded already: importing it took 0.16 s in
    # processes that never sample (the API server, the engine core); loaded later, it takes
    # the replaced function from where it is defined
    holders = [defined_in]
    if _CALLED_FROM in sys.modules:
        holders.append(sys.modules[_CALLED_FROM])
    if not all(callable(getattr(module, _NAME, None)) for module in holders):
        log.warning("vLLM's %s moved; its first logprobs request compiles it", _NAME)
        return
    compiled = getattr(defined_in, _NAME)

    def count(x: Any, values: Any) -> Any:
        if x.shape[-1] <= EAGER_MAX_VOCAB:
            return count_at_least(x, values)
        return compiled(x, values)

    for module in holders:
        setattr(module, _NAME, count)
