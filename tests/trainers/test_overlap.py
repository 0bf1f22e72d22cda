"""`max_staleness` 1: the update runs in a thread while the next step rolls out.

The thread cannot be cancelled, so whatever ends the rollouts early (a cancel, an error) must
wait for the update to finish: a run that stops must never leave the weights half-updated,
nor write a checkpoint while the optimiser is mid-step. The end-to-end overlap is in
`tests/trainers/test_grpo.py`.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentgym.trainers import GRPOTrainer


class Update:
    """A stand-in for `GRPOTrainer._update_beside_rollouts`, held until the test releases it."""

    def __init__(self, error: Exception | None = None) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.finished = False
        self.error = error

    def __call__(self, *args: object) -> dict[str, float]:
        self.started.set()
        assert self.release.wait(30), "the test never released the update"
        self.finished = True
        if self.error is not None:
            raise self.error
        return {"loss/value": 0.5}


def overlapping(update: Update, collect) -> GRPOTrainer:
    trainer = object.__new__(GRPOTrainer)  # only the two stages the overlap calls
    trainer._update_beside_rollouts = update  # type: ignore[method-assign]
    trainer._collect = collect  # type: ignore[method-assign]
    return trainer


async def start(trainer: GRPOTrainer, update: Update) -> asyncio.Task:
    task = asyncio.create_task(
        trainer._update_while_collecting(None, None, [], None, None, 2, 1)  # type: ignore[arg-type]
    )
    assert await asyncio.to_thread(update.started.wait, 30)  # the update holds the weights
    return task


async def still_running(task: asyncio.Task) -> bool:
    done, _ = await asyncio.wait({task}, timeout=0.2)  # a bound on a wait that must not end
    return not done


async def test_a_cancelled_rollout_waits_for_the_update_thread() -> None:
    update = Update()
    trainer = overlapping(update, lambda *args: asyncio.Event().wait())  # rolls out forever
    task = await start(trainer, update)
    task.cancel()
    assert await still_running(task)  # cancelled, yet waiting for the update
    update.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert update.finished


async def test_a_failed_rollout_raises_only_after_the_update() -> None:
    update = Update()

    async def collect(*args: object) -> None:
        await asyncio.to_thread(update.started.wait, 30)
        raise RuntimeError("the engine died")

    task = await start(overlapping(update, collect), update)
    assert await still_running(task)
    update.release.set()
    with pytest.raises(RuntimeError, match="the engine died"):
        await task
    assert update.finished


async def test_a_failed_update_raises_once_the_rollouts_are_in() -> None:
    update = Update(error=FloatingPointError("loss is nan"))
    collected = asyncio.Event()

    async def collect(*args: object) -> str:
        await collected.wait()
        return "episodes"

    task = await start(overlapping(update, collect), update)
    update.release.set()
    assert await still_running(task)  # the rollouts still run
    collected.set()
    with pytest.raises(FloatingPointError, match="loss is nan"):
        await task


async def test_the_overlap_returns_the_update_and_the_next_steps_episodes() -> None:
    update = Update()

    async def collect(policy: object, step: int, version: int) -> tuple[int, int]:
        return step, version

    task = await start(overlapping(update, collect), update)
    update.release.set()
    (metrics, seconds), ahead = await task
    assert metrics == {"loss/value": 0.5} and seconds > 0
    assert ahead == (2, 1)  # next step 2, rolled out on v1
