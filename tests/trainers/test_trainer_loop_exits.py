"""A training run's event loop ends cleanly: after a Ctrl-C in env code, and past a stuck close.

The run plays its rollouts on one loop of its own (`GRPOTrainer._rollout_loop`). On a plain
`asyncio.Runner`, a Ctrl-C landing in env code was raised a second time by the run's close of
its envs, which it cut short (envs left open), and asyncio then printed "Task exception was
never retrieved" with a second traceback (seen in CI under
``test_ctrl_c_says_what_was_kept_and_how_to_resume``); and an env's close stuck in
``asyncio.to_thread`` (left open after ``close_timeout``) hung the end of `train()` for good:
the runner's close waited for that thread without a limit.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym import EnvPool, ScriptedPolicy, arollout
from agentgym._tool_calls import CANCEL_GRACE_SECONDS
from agentgym.trainers import GRPOConfig, GRPOTrainer
from envs.calculator import CalculatorEnv
from tests.conftest import TINY_RUN
from tests.test_run_loop_exits import StuckClose


class CtrlCInSetup(CalculatorEnv):
    """The calculator, interrupted once (one Ctrl-C) as an episode is set up, after ``armed``.

    It notes each env that played (``played``) and each that closed (``closed``).
    """

    armed = False
    played: set[int] = set()
    closed: set[int] = set()

    async def setup_episode(self, task: dict[str, Any]) -> None:
        CtrlCInSetup.played.add(id(self))
        if CtrlCInSetup.armed:
            CtrlCInSetup.armed = False
            raise KeyboardInterrupt
        await super().setup_episode(task)

    async def aclose(self) -> None:
        CtrlCInSetup.closed.add(id(self))
        await super().aclose()


@pytest.fixture
def trainer(tmp_path: Path) -> GRPOTrainer:
    agentgym.register("tests/CtrlCInSetup-v0", CtrlCInSetup)
    knobs = {
        **TINY_RUN, "env": "tests/CtrlCInSetup-v0", "rollout_engine": "hf",
        "output_dir": str(tmp_path / "run"),
    }  # fmt: skip
    return GRPOTrainer(GRPOConfig.from_dict(knobs))


def test_a_ctrl_c_in_env_code_leaves_no_unretrieved_task_and_closes_the_runs_envs(
    trainer: GRPOTrainer, caplog: pytest.LogCaptureFixture
) -> None:
    """The old run's close of its envs was itself cut by the interrupt, raised again."""
    policy = ScriptedPolicy(["<answer>1</answer>"])
    CtrlCInSetup.played.clear()
    CtrlCInSetup.closed.clear()
    CtrlCInSetup.armed = True
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with pytest.raises(KeyboardInterrupt), trainer._rollout_loop():
            trainer._run(arollout(trainer._envs, policy, num_tasks=2))
        gc.collect()  # the task that kept the interrupt is reported when it is collected
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "never retrieved" in m], said
    assert CtrlCInSetup.played and CtrlCInSetup.played <= CtrlCInSetup.closed


def test_a_close_stuck_in_a_thread_does_not_hang_the_end_of_the_run(
    trainer: GRPOTrainer, caplog: pytest.LogCaptureFixture
) -> None:
    StuckClose.unblock.clear()
    # a safety net, not the sync: the old run ended only once the thread did
    release = threading.Timer(20, StuckClose.unblock.set)
    release.daemon = True
    release.start()
    pool = EnvPool(StuckClose, close_timeout=0.2)  # the failed episode's close is left at 0.2 s
    policy = ScriptedPolicy(["<answer>1</answer>"])
    try:
        with caplog.at_level(logging.WARNING, logger="agentgym"):
            with trainer._rollout_loop():
                played = trainer._run(arollout(pool, policy, num_tasks=1))
                started = time.monotonic()
            elapsed = time.monotonic() - started
    finally:
        StuckClose.unblock.set()
        release.cancel()
    assert [t.status for t in played] == ["error"]
    assert elapsed < CANCEL_GRACE_SECONDS + 5, elapsed
    said = [r.getMessage() for r in caplog.records]
    left = [m for m in said if m.startswith("train(): 1 thread(s) of its event loop")]
    assert len(left) == 1 and "cannot be stopped" in left[0], said
