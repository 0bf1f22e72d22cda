"""`Env`: seeding is the same on the sync and async paths, as Gymnasium specifies."""

from __future__ import annotations

import ast
import asyncio
import inspect
import subprocess
import sys
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.utils import seeding
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym import Env, ScriptedPolicy, rollout


class DiceEnv(Env):
    """A direct `Env` subclass that rolls its question with `np_random`, ignoring options."""

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        roll = int(self.np_random.integers(1_000_000))
        self.messages = [{"role": "user", "content": f"roll {roll}"}]
        return list(self.messages), {"task": {"roll": roll}}

    async def astep(self, action):
        new = [{"role": "assistant", "content": getattr(action, "text", action)}]
        self.messages += new
        return new, 0.0, True, False, {}


def rolls(trajectories: list[agentgym.Trajectory]) -> list[int]:
    assert all(t.status == "ok" for t in trajectories), [t.error for t in trajectories]
    return [t.task["roll"] for t in trajectories]


def test_rollout_with_the_same_seed_draws_the_same_tasks() -> None:
    def play(seed: int) -> list[int]:
        return rolls(
            rollout(DiceEnv, ScriptedPolicy(["ok"]), tasks=[0, 1], group_size=2, seed=seed)
        )

    first = play(7)
    assert play(7) == first
    assert play(8) != first
    assert len(set(first)) == 4  # every episode has its own seed


def test_sync_and_async_reset_seed_alike() -> None:
    sync_env, async_env = DiceEnv(), DiceEnv()
    sync_obs, _ = sync_env.reset(seed=3)
    async_obs, _ = asyncio.run(async_env.areset(seed=3))  # the rollout engine's path
    assert sync_obs == async_obs
    assert sync_env.np_random_seed == async_env.np_random_seed == 3


def test_reset_without_seed_keeps_the_generator_going() -> None:
    env = DiceEnv()
    first, _ = env.reset(seed=3)
    second, _ = env.reset()
    again, _ = env.reset(seed=3)
    assert again == first and second != first


def test_direct_subclass_passes_gymnasium_check_env() -> None:
    check_env(DiceEnv(), skip_render_check=True)


def test_base_areset_is_an_empty_conversation() -> None:
    env = Env()
    assert env.reset(seed=0) == ([], {})


def _agentgym_imports(module: Any) -> set[str]:
    tree = ast.parse(inspect.getsource(module))
    return {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


@pytest.mark.parametrize("module", [agentgym._env, agentgym._tool_env], ids=lambda m: m.__name__)
def test_env_layer_does_not_import_the_policy_layer(module: Any) -> None:
    assert "_policies" not in _agentgym_imports(module)


def test_importing_the_tool_env_does_not_load_httpx() -> None:
    code = "import sys, agentgym._tool_env; print('httpx' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.strip() == "False"


def test_seeded_reset_draws_what_gymnasium_would() -> None:
    env = DiceEnv()
    env.reset(seed=11)
    expected, _ = seeding.np_random(11)
    expected.integers(1_000_000)  # what DiceEnv drew in reset
    assert (
        env.np_random.integers(1 << 30, size=5).tolist()
        == expected.integers(1 << 30, size=5).tolist()
    )
    assert env.np_random_seed == 11


def test_generator_is_built_only_when_drawn_from() -> None:
    env = Env()
    env.reset(seed=5)
    assert env._lazy_rng is None  # nothing drew yet: no generator built
    assert env.np_random_seed == 5
    assert env.np_random.integers(100) == seeding.np_random(5)[0].integers(100)


class EchoEnv(Env):
    """An env written as the docs say, which never draws from ``np_random``."""

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.messages = [{"role": "user", "content": "say hi"}]
        return list(self.messages), {}

    async def astep(self, action):
        text = action if isinstance(action, str) else action.text
        new = [{"role": "assistant", "content": text}]
        self.messages += new
        reward = float("hi" in text)
        return new, reward, True, False, {"step_reward": reward}


def test_gymnasiums_checker_passes_an_env_that_never_draws() -> None:
    # the checker reads the private generator right after reset(seed=123): a pending seed
    # must build it then, or the checker says reset did not call super().reset(seed=seed)
    check_env(EchoEnv(), skip_render_check=True)


def test_bad_seed_fails_at_reset_as_in_gymnasium() -> None:
    with pytest.raises(gymnasium.error.Error, match="greater or equal to zero"):
        Env().reset(seed=-1)


def test_a_set_generator_replaces_a_pending_seed() -> None:
    env = Env()
    env.reset(seed=5)
    env.np_random = np.random.default_rng(99)
    assert env.np_random.integers(1000) == np.random.default_rng(99).integers(1000)
    assert env.np_random_seed == -1
