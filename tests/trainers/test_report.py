"""The reward-curve PNG and the run summary, from a hand-written metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.runs._folder import read_figures
from agentgym.trainers._report import plot_curves, summarize, write_summary
from tests.conftest import require


def write_metrics(path: Path, torn_tail: bool = False) -> None:
    rows = [{"step": 0, "eval/success": 0.1}]
    for step in range(1, 21):
        rows.append({
            "step": step, "reward/mean": step / 20, "reward/std": 0.1,
            "reward/correct_answer/mean": step / 25, "time/rollout": 2.0, "time/sync": 0.05,
        })  # fmt: skip
        if step % 10 == 0:
            rows[-1]["eval/success"] = step / 21
    rows.append({"step": 20, "final/success": 0.95})
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + ('{"step": 21, "rew' if torn_tail else ""))


def read_png(path: Path) -> tuple[int, int, float]:
    """(height, width, pixel std) as matplotlib reads the PNG back."""
    require("matplotlib")
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    return pixels.shape[0], pixels.shape[1], float(pixels.std())


def test_plot_curves_writes_a_readable_non_blank_png(tmp_path: Path) -> None:
    require("matplotlib")
    write_metrics(tmp_path / "metrics.jsonl", torn_tail=True)
    out = plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curve.png", title="calculator")
    assert out == tmp_path / "curve.png" and out.stat().st_size > 20_000
    height, width, spread = read_png(out)
    assert (height, width) == (400, 1100) and spread > 0.05
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_more_data_draws_more_ink(tmp_path: Path) -> None:
    require("matplotlib")
    (tmp_path / "empty.jsonl").write_text("")
    write_metrics(tmp_path / "metrics.jsonl")
    empty = plot_curves(tmp_path / "empty.jsonl", tmp_path / "empty.png", title="calculator")
    full = plot_curves(tmp_path / "metrics.jsonl", tmp_path / "full.png", title="calculator")
    assert read_png(full)[2] > read_png(empty)[2] > 0  # the empty one still says "no data"


def test_plot_curves_without_matplotlib_names_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentgym import ConfigError

    monkeypatch.setitem(__import__("sys").modules, "matplotlib.figure", None)
    with pytest.raises(ConfigError, match="pip install matplotlib"):
        plot_curves(tmp_path / "m.jsonl", tmp_path / "c.png", title="x")


def test_summary_figures_reward_change_and_times(tmp_path: Path) -> None:
    write_metrics(tmp_path / "metrics.jsonl")
    (tmp_path / "reward_curve.png").write_bytes(b"png")
    figures = {"grpo/success": 0.95, "base/success": 0.02, "sft/success": 0.4}
    text = write_summary(tmp_path, figures)
    assert "held-out success  base 2.0%  ->  after SFT 40.0%  ->  after GRPO 95.0%" in text
    assert "reward            0.050 (first step) -> 1.000 (last), best 1.000" in text
    assert "rollout 40.0s  sync 1.0s" in text and str(tmp_path / "reward_curve.png") in text
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["steps"] == 20 and saved["figures"] == figures
    assert saved["eval_success"][0] == [0, 0.1] and saved["sync_seconds_per_step"] == 0.05
    assert (tmp_path / "summary.txt").read_text() == text + "\n"


def test_summary_points_to_a_kept_checkpoint_that_beat_the_last_step(tmp_path: Path) -> None:
    from tests.trainers.test_export import eval_lines

    write_metrics(tmp_path / "metrics.jsonl")
    (tmp_path / "config.yaml").write_text("model: tiny\n")
    for step in (10, 20):
        (tmp_path / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step-{step:06d}" / "trainer_state.json").write_text("{}")
    evals = tmp_path / "eval_trajectories.jsonl"
    evals.write_text(eval_lines({(10, "eval"): {0, 1, 2}, (20, "final"): {0, 1}}, range(4)))
    text = write_summary(tmp_path, {"grpo/success": 0.5})
    assert (f"best checkpoint   step 10: 75% against step 20's 50% on 4 held-out tasks; "
            f"agentgym export {tmp_path} OUT --best") in text
    evals.write_text(eval_lines({(10, "eval"): {0}, (20, "final"): {0, 1}}, range(4)))
    assert "best checkpoint" not in write_summary(tmp_path, {"grpo/success": 0.5})  # the last


def test_summary_of_a_run_without_steps() -> None:
    summary = summarize([], {})
    assert summary["steps"] == 0 and summary["reward"] is None and summary["eval_success"] == []


def test_summary_says_what_the_warm_start_learned_and_how_tool_use_moved(tmp_path: Path) -> None:
    rows = [{"step": s, "reward/mean": 0.5, "rollout/tool_calls_per_episode": c}
            for s, c in ((1, 0.25), (2, 0.5), (3, 0.97))]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "sft").mkdir()
    history = [{"step": 10, "reference_accuracy": 0.3}, {"step": 20, "loss": 0.1},
               {"step": 30, "reference_accuracy": 0.93}]  # fmt: skip
    (tmp_path / "sft" / "sft.json").write_text(json.dumps({"history": history}))
    text = write_summary(tmp_path, {"sft/success": 0.0})
    warm = "warm start        3 SFT steps, validation traces carried out 93% (teacher forced)"
    assert warm in text
    assert "tool calls        0.25 per episode (first step) -> 0.97 (last)" in text
    # the warm start's figures are kept in the summary, so `runs ls` / `compare` show them
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["warm_start"] == {"steps": 3, "reference_accuracy": 0.93}
    assert read_figures(tmp_path)["warm_start/reference_accuracy"] == 0.93
