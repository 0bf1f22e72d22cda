"""Resuming with the knobs that bound memory, and resuming a finished run with fewer steps.

A run that ran out of memory is resumed with the fix (``micro_batch_tokens``,
``gradient_checkpointing`` ...): those knobs change how a step's samples are cut into passes
or how much memory the engine takes, not what the step trains on or the update it makes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentgym.trainers import GRPOConfig
from agentgym.trainers._plan import dry_run
from agentgym.trainers._run_dir import RunDir
from tests.conftest import TINY_RUN
from tests.trainers.test_damaged_run_folder import refusal, run_with_checkpoints

#: Runs a test leaves open keep a log handler; conftest.py drops them after each test.
pytestmark = pytest.mark.usefixtures("detach_run_logs")

#: What an out-of-memory run is resumed with: each bounds memory, none changes the update.
MEMORY_FIXES: dict[str, Any] = {
    "micro_batch_tokens": 512,
    "gradient_checkpointing": True,
    "gradient_accumulation_steps": 2,
    "vllm_gpu_memory_utilization": 0.5,
    "max_concurrency": 2,
}


def tiny_config(path: Path, **changes: Any) -> dict[str, Any]:
    """The resolved config of the tests' tiny run in ``path`` (as `RunDir` saves it)."""
    return GRPOConfig(**{**TINY_RUN, "output_dir": str(path), "max_steps": 3, **changes}).to_dict()


def test_a_run_is_resumed_with_the_knobs_that_bound_memory(tmp_path: Path) -> None:
    """The probe's run was refused: "differs ... in micro_batch_tokens (saved None, now 512)"."""
    saved = tiny_config(tmp_path)
    run_with_checkpoints(tmp_path, saved, 1).mark_failed(MemoryError("CUDA out of memory"))
    fixed = tiny_config(tmp_path, **MEMORY_FIXES)
    defaults = GRPOConfig.defaults()
    assert RunDir.check_open(tmp_path, fixed, resume=True, defaults=defaults) is not None
    resumed = RunDir(tmp_path, fixed, resume=True, defaults=defaults)
    assert resumed.resume_step == 1
    assert all(resumed.config[key] == value for key, value in MEMORY_FIXES.items())


def test_knobs_that_change_the_update_or_the_samples_are_still_refused(tmp_path: Path) -> None:
    """Taken per pass, a top-entropy quantile depends on how the samples are cut into passes."""
    quantile = tiny_config(tmp_path / "quantile", top_entropy_quantile=0.2)
    run_with_checkpoints(tmp_path / "quantile", quantile, 1).mark_failed(MemoryError("oom"))
    said = refusal(RunDir, tmp_path / "quantile",
                   {**quantile, "micro_batch_tokens": 512}, resume=True)  # fmt: skip
    assert "differs from the saved one in micro_batch_tokens (saved None, now 512)" in said
    saved = tiny_config(tmp_path / "sampling")
    run_with_checkpoints(tmp_path / "sampling", saved, 1).mark_failed(MemoryError("oom"))
    said = refusal(RunDir, tmp_path / "sampling", {**saved, "temperature": 0.5}, resume=True)
    assert "differs from the saved one in temperature (saved 1.0, now 0.5)" in said


def finished_run(path: Path, config: dict[str, Any]) -> None:
    """A run in ``path`` that finished step 3 (its last checkpoint) and wrote its figures."""
    run = run_with_checkpoints(path, config, 1, 2, 3)
    (path / "summary.json").write_text('{"figures": {"final/success": 0.5}}')
    run.mark_finished()


def test_a_finished_run_resumed_with_fewer_steps_is_refused_as_an_unfinished_one(
    tmp_path: Path,
) -> None:
    """It said "has finished (max_steps 2 reached)" with the figures of step 3."""
    saved = tiny_config(tmp_path / "run")
    finished_run(tmp_path / "run", saved)
    fewer = {**saved, "max_steps": 2}
    said = refusal(RunDir.finished_figures, tmp_path / "run", 2, fewer)
    assert said == (
        f"cannot resume {tmp_path / 'run'} with max_steps=2: it finished at step 3; set "
        "max_steps to 3 or more, or export that checkpoint as it is"
    )
    assert refusal(RunDir, tmp_path / "run", fewer, resume=True) == said
    cfg = GRPOConfig(**{**TINY_RUN, "output_dir": str(tmp_path / "run"), "max_steps": 2})
    assert refusal(dry_run, cfg, resume=True) == said  # what --dry-run says, before any load
    assert RunDir.finished_figures(tmp_path / "run", 3, saved) == {"final/success": 0.5}
