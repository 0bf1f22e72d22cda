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

import asyncio
import gc
import logging
import time
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym import EnvPool, Rubric, ScriptedPolicy, ToolEnv, arollout, tool
from agentgym._tool_calls import CANCEL_GRACE_SECONDS
from agentgym.trainers import GRPOConfig, GRPOTrainer
from envs.calculator import CalculatorEnv
from tests.conftest import TINY_RUN, hermes_call
from tests.test_run_loop_exits import StuckClose, closes_stuck_until_the_end


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


class ParkedOrCtrlC(ToolEnv):
    """Task 0's episode meets a Ctrl-C in its setup once another's has parked in a tool call.

    It notes each env made (``made``) and each whose close ran to its end (``closed``); a
    close takes longer than `CANCEL_GRACE_SECONDS`, well within its ``close_timeout``, as a
    sandbox's may on a busy Docker daemon.
    """

    made: set[int] = set()
    closed: set[int] = set()
    parked: asyncio.Event  # set by the parked tool call; made on the loop that plays

    def __init__(self, num_tasks: int, max_turns: int) -> None:
        tasks = [{"prompt": "interrupt"}] + [{"prompt": "park"}] * (num_tasks - 1)
        super().__init__([park], tasks=tasks, rubric=Rubric([lambda completion: 0.0]),
                         max_turns=max_turns)  # fmt: skip
        ParkedOrCtrlC.made.add(id(self))

    async def setup_episode(self, task: dict[str, Any]) -> None:
        if task["prompt"] == "interrupt":
            await ParkedOrCtrlC.parked.wait()
            raise KeyboardInterrupt

    async def aclose(self) -> None:
        await super().aclose()
        await asyncio.sleep(CANCEL_GRACE_SECONDS + 0.5)
        ParkedOrCtrlC.closed.add(id(self))


@tool
async def park() -> str:
    """Wait for an event that never comes (a tool call still running at the Ctrl-C)."""
    ParkedOrCtrlC.parked.set()
    await asyncio.Event().wait()
    return "never"


def _trainer(tmp_path: Path, env_id: str) -> GRPOTrainer:
    knobs = {
        **TINY_RUN, "env": env_id, "rollout_engine": "hf", "output_dir": str(tmp_path / "run"),
    }  # fmt: skip
    return GRPOTrainer(GRPOConfig.from_dict(knobs))


@pytest.fixture
def trainer(tmp_path: Path) -> GRPOTrainer:
    agentgym.register("tests/CtrlCInSetup-v0", CtrlCInSetup)
    return _trainer(tmp_path, "tests/CtrlCInSetup-v0")


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


def test_a_ctrl_c_in_one_episode_closes_the_env_of_another_still_playing(tmp_path: Path) -> None:
    """The old run closed its pool, and then its loop, while the other episode still closed its env.

    That close had only the loop's end, `CANCEL_GRACE_SECONDS`, not its ``close_timeout``:
    it was cut, and the env left open.
    """
    agentgym.register("tests/ParkedOrCtrlC-v0", ParkedOrCtrlC)
    trainer = _trainer(tmp_path, "tests/ParkedOrCtrlC-v0")
    ParkedOrCtrlC.made.clear()
    ParkedOrCtrlC.closed.clear()
    ParkedOrCtrlC.parked = asyncio.Event()
    policy = ScriptedPolicy([hermes_call("park"), "done"])
    with pytest.raises(KeyboardInterrupt), trainer._rollout_loop():
        trainer._run(arollout(trainer._envs, policy, tasks=[0, 1], max_concurrency=2))
    assert len(ParkedOrCtrlC.made) == 2  # the interrupted episode's env, and the parked one's
    assert ParkedOrCtrlC.made == ParkedOrCtrlC.closed


def test_a_close_stuck_in_a_thread_does_not_hang_the_end_of_the_run(
    trainer: GRPOTrainer, caplog: pytest.LogCaptureFixture
) -> None:
    pool = EnvPool(StuckClose, close_timeout=0.2)  # the failed episode's close is left at 0.2 s
    policy = ScriptedPolicy(["<answer>1</answer>"])
    with closes_stuck_until_the_end(), caplog.at_level(logging.WARNING, logger="agentgym"):
        with trainer._rollout_loop():
            played = trainer._run(arollout(pool, policy, num_tasks=1))
            started = time.monotonic()
        elapsed = time.monotonic() - started
    assert [t.status for t in played] == ["error"]
    assert elapsed < CANCEL_GRACE_SECONDS + 5, elapsed
    said = [r.getMessage() for r in caplog.records]
    left = [m for m in said if m.startswith("train(): 1 thread(s) of its event loop")]
    assert len(left) == 1 and "cannot be stopped" in left[0], said
