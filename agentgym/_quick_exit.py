"""Processes that hold torch or vLLM exit without Python's last full garbage collection.

Why: at shutdown Python collects every tracked object once more. After importing torch,
transformers and vLLM that is hundreds of thousands of objects (module state, never garbage),
and the walk cost 1.3-1.5 s at the end of every ``agentgym`` command on the 2-core machine
this was measured on (bench/engine_lifecycle_bench.py). In vLLM's worker it took about 3 s,
so ``VLLMPolicy.close()`` waited 5 s, until vLLM gave up and killed its engine core; with
this, 1.6-1.7 s.

What it skips: only the collection of reference cycles that are still garbage at exit, and the
``__del__`` of objects in them. atexit handlers still run (``weakref.finalize``, temporary
folders), and agentgym closes and flushes what it writes explicitly (`agentgym._durable`).
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def skip_final_collection() -> None:
    """Make this process exit without its final full collection (once per process)."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(gc.freeze)  # frozen objects are left out of every later collection
