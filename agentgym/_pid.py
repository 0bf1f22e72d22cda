"""Whether a process still runs, by its pid: one question, asked by every owner check.

Why: run rows, sandbox containers, run folders and MCP logs all name the process that owns
them, and each is settled once that process is gone. Four copies of this check had drifted
(one took pid 0, which `os.kill` reads as "my process group", for a live process).
"""

from __future__ import annotations

import os


def process_alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live process on this host (one of another user's counts as live)."""
    if not pid or pid < 0:  # os.kill(0 or -N, 0) asks about a process group, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive, and not ours to judge
        return True
    return True
