"""Shared sandbox pools across ``fork``: Gymnasium's fork-mode `AsyncVectorEnv` workers.

A forked worker used to inherit its parent's shared pool (a copy whose containers, threads
and sockets are the parent's): it waited forever for a lease, or its calls timed out and were
blamed on the model. And a worker exits with ``os._exit``, which skips ``atexit``, so the pool
it built outlived ``envs.close()``. Each scenario runs in a subprocess of its own process
group, bounded by a timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from agentgym.sandboxes import _reap
from agentgym.sandboxes._client import docker_client

TIMEOUT_S = 120.0
"""Bound on one scenario (a fork-mode worker waiting on its parent's pool never returns)."""

_VEC = """
import json, gymnasium, agentgym
from agentgym.sandboxes import _reap
print(_reap.PROCESS_SESSION, flush=True)
CODE = '<tool_call>{"name": "run_python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
def vec():
    return gymnasium.make_vec("agentgym/PythonCode-v0", num_envs=2,
                              vectorization_mode="async", pool_size=1, tool_timeout=30,
                              vector_kwargs={"shared_memory": False, "context": "fork"})
def last(obs):
    return obs[-1]["content"]
"""

PARENT_POOL_FIRST = _VEC + """
parent = agentgym.make("agentgym/PythonCode-v0", pool_size=1, tool_timeout=30)
parent.reset(seed=0)  # starts this process's shared pool before the fork
envs = vec()
envs.reset(seed=0)
obs, _, _, _, info = envs.step((CODE, CODE))
envs.close()
after = parent.step(CODE)[0]  # the workers left the parent's containers alone
print(json.dumps({"tool_errors": info["tool_errors"].tolist(),
                  "workers": [last(o) for o in obs], "parent": last(after)}))
parent.close()
"""

WORKERS_ONLY = _VEC + """
envs = vec()
envs.reset(seed=0)
obs, _, _, _, info = envs.step((CODE, CODE))
envs.close()
print(json.dumps({"tool_errors": info["tool_errors"].tolist(),
                  "workers": [last(o) for o in obs]}))
"""


def _session_containers(session: str) -> list:
    """The agentgym containers made by the scenario's process and its forked workers."""
    return [c for c in _reap.managed_containers(docker_client())
            if c.labels.get(_reap.SESSION) == session]


def run_scenario(script: str) -> tuple[dict, list[str]]:
    """Run ``script``; return its result and the ids of its containers still there after it.

    Those containers are removed before returning, so a failing test leaks nothing.
    """
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the forked workers too
        out, err = proc.communicate()
    session, _, result = out.partition("\n")
    left = _session_containers(session.strip()) if session else []
    for container in left:
        container.remove(force=True)
    assert proc.returncode == 0, f"scenario failed or hung (rc {proc.returncode}):\n{err[-3000:]}"
    return json.loads(result), [c.short_id for c in left]


def test_forked_workers_build_their_own_pool_not_the_parents(docker_ready) -> None:
    result, _ = run_scenario(PARENT_POOL_FIRST)
    assert result["tool_errors"] == [[], []]
    assert all("42" in text for text in result["workers"]), result["workers"]
    assert "42" in result["parent"]


def test_forked_workers_remove_their_containers_at_envs_close(docker_ready) -> None:
    result, left = run_scenario(WORKERS_ONLY)
    assert result["tool_errors"] == [[], []]
    assert not left, f"containers left running after envs.close(): {left}"


CHILD_EXITS_NORMALLY = """
import json, os, sys
from agentgym.sandboxes import DockerSandbox, _reap
print(_reap.PROCESS_SESSION, flush=True)
sb = DockerSandbox()
sb.run("print(1)")  # a live container of this (the parent) process
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a normal exit: atexit hooks run in the child
os.waitpid(pid, 0)
print(json.dumps({"after_child": sb.run("print(6 * 7)").stdout.strip()}))
sb.close()
"""


def test_a_forked_child_exiting_normally_leaves_its_parents_containers(docker_ready) -> None:
    """The child's exit hook closed the sandboxes it had copied: the parent's container."""
    result, left = run_scenario(CHILD_EXITS_NORMALLY)
    assert result["after_child"] == "42"
    assert not left


PARENT_DIES_CHILD_LIVES = """
import os, sys
from agentgym.sandboxes import DockerSandbox
sb = DockerSandbox()
sb.run("print(1)")
if os.fork() == 0:
    sys.stdin.read()  # lives until the test closes its stdin
    os._exit(0)
print(sb.container_id, flush=True)
os._exit(0)  # as kill -9: no exit hook closes the sandbox, only the lifeline's end stops it
"""


def test_a_forked_child_does_not_keep_its_dead_parents_containers_up(docker_ready) -> None:
    """The child held a copy of each lifeline: the parent's containers ran while it lived."""
    proc = subprocess.Popen([sys.executable, "-c", PARENT_DIES_CHILD_LIVES],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stdin is not None
    container_id = proc.stdout.readline().strip()
    client = docker_client()
    try:
        assert container_id, "the scenario made no container"
        proc.wait(timeout=TIMEOUT_S)  # the parent is gone; its child (same group) lives on
        deadline = time.monotonic() + 30
        while any(c.id == container_id for c in _reap.managed_containers(client)):
            assert time.monotonic() < deadline, "the parent's container outlived it"
            time.sleep(0.2)  # polling the daemon: nothing to wait on
    finally:
        proc.stdin.close()  # the child reads EOF and exits
        with contextlib.suppress(ProcessLookupError):  # the child exited already
            os.killpg(proc.pid, signal.SIGKILL)
        for container in _reap.managed_containers(client):
            if container.id == container_id:
                container.remove(force=True)
