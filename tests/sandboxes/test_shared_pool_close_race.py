"""`close_shared_pools()` while an episode is starting its shared pool: no container is left.

An episode takes its pool's slot from the registry, then starts the pool in a thread. A close
between the two (a test's finalizer; a rollout ending while an episode it left past its grace
still runs) used to forget the slot first: the episode then started a pool through it that no
later `close_shared_pools()`, nor the exit hooks, saw, so its containers ran until the process
died. Now that episode is ``infra_error``, and a later rollout gets a fresh, tracked pool.
"""

from __future__ import annotations

import threading

import pytest

import agentgym
from agentgym.sandboxes import (
    DEFAULT_IMAGE,
    SandboxPool,
    SandboxToolEnv,
    _reap,
    close_shared_pools,
)
from agentgym.sandboxes._config import docker_config
from agentgym.sandboxes._env import _slot
from tests.sandboxes.conftest import own_containers
from tests.sandboxes.test_fork_pool import run_scenario

pytestmark = pytest.mark.docker

WAIT_S = 120.0
"""Bound on each wait for the episode's thread (a regression fails instead of hanging)."""


def rollout_keeping(envs: list[SandboxToolEnv]) -> agentgym.Trajectory:
    """One episode on a one-sandbox shared pool; its env is added to ``envs`` (its ``pool``)."""
    def make() -> SandboxToolEnv:
        envs.append(SandboxToolEnv([], tasks=[{"prompt": "x"}], pool_size=1))
        return envs[-1]

    [trajectory] = agentgym.rollout(make, agentgym.ScriptedPolicy(["done"]), tasks=[0])
    return trajectory


def test_a_close_while_an_episode_starts_its_pool_leaves_no_container(
        docker_ready, monkeypatch: pytest.MonkeyPatch) -> None:
    close_shared_pools()  # the slot below is then the one the episode takes
    slot = _slot(DEFAULT_IMAGE, docker_config(None), 1, None)
    arrived, release = threading.Event(), threading.Event()
    start = slot._start

    def parked(seen: int) -> SandboxPool:
        """The episode's pool start, held in its thread until the test has closed the pools."""
        arrived.set()
        release.wait(WAIT_S)
        return start(seen)

    monkeypatch.setattr(slot, "_start", parked)
    envs: list[SandboxToolEnv] = []
    outcome: list[agentgym.Trajectory] = []
    episode = threading.Thread(target=lambda: outcome.append(rollout_keeping(envs)))
    episode.start()
    try:
        assert arrived.wait(WAIT_S), "the episode never reached its pool's start"
        close_shared_pools()
        release.set()
        episode.join(WAIT_S)
        assert not episode.is_alive(), "the episode did not end"
        fresh = rollout_keeping(envs)  # a new rollout after the close
        close_shared_pools()
        pools = {env.pool.pool_id for env in envs if env.pool is not None}
        left = [c.short_id for c in own_containers() if c.labels.get(_reap.POOL) in pools]
        assert not left, f"containers left after the final close_shared_pools(): {left}"
        [raced] = outcome
        assert raced.status == "infra_error" and raced.final_reward is None
        assert "close_shared_pools() while this episode was starting" in raced.error
        assert fresh.status == "ok", fresh.error
        assert len(pools) == 1, "the fresh rollout got no pool of its own"
    finally:
        release.set()
        for env in envs:  # what a failure left: nothing else would close it
            if env.pool is not None:
                env.pool.close()


EXIT_SCENARIO = """
import atexit, json, multiprocessing, multiprocessing.util, os
import agentgym
from agentgym import SandboxError
from agentgym.sandboxes import DEFAULT_IMAGE, SandboxToolEnv, close_shared_pools, _reap
from agentgym.sandboxes._client import docker_client
from agentgym.sandboxes._config import docker_config
from agentgym.sandboxes._env import _slot

def left_at_exit():  # hooked before the pools' hook, so it runs after it
    mine = [c.short_id for c in _reap.managed_containers(docker_client())
            if c.labels.get(_reap.OWNER) == str(os.getpid())]
    print(json.dumps({"left": mine}), flush=True)

def main():
    slot = _slot(DEFAULT_IMAGE, docker_config(None), 1, None)  # an episode took its slot,
    seen = slot.attempts
    close_shared_pools()                                        # the pools were closed,
    try:
        slot._start(seen)                                       # then it started its pool
    except SandboxError:
        pass
    make = lambda: SandboxToolEnv([], tasks=[{"prompt": "x"}], pool_size=1)
    [t] = agentgym.rollout(make, agentgym.ScriptedPolicy(["done"]), tasks=[0])
    assert t.status == "ok", t.error  # its fresh pool is left open for the exit hooks

print(_reap.PROCESS_SESSION, flush=True)
if EXIT == "atexit":
    atexit.register(left_at_exit)
    main()
else:  # a fork-mode worker: it ends with os._exit, after its Finalize callbacks
    def worker():
        multiprocessing.util.Finalize(None, left_at_exit, exitpriority=-1)
        main()
    process = multiprocessing.get_context("fork").Process(target=worker)
    process.start()
    process.join()
    assert process.exitcode == 0, process.exitcode
"""


@pytest.mark.parametrize("exit_hook", ["atexit", "finalize"])
def test_the_exit_hooks_close_every_pool_after_a_close_during_a_start(
        docker_ready, exit_hook: str) -> None:
    """A guard for the refusal, not for the leak: the exit hooks still close the fresh pool.

    (The forgotten pool the old code started was closed at exit too, by `_reap`'s hook: the
    leak was while the process ran.) Checked by the exiting process itself: once it is gone,
    the lifelines end the rest.
    """
    result, _ = run_scenario(f"EXIT = {exit_hook!r}\n{EXIT_SCENARIO}")
    assert result["left"] == [], f"containers left after the {exit_hook} hook: {result['left']}"
