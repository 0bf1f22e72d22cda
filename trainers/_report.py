"""End-of-run report: the reward-curve PNG and the summary (``summary.json`` + a text block).

Both read ``metrics.jsonl`` (`RunDir.write_metrics`), so they also work on a run folder after
the fact (a killed run, a run from another machine). matplotlib draws through its Agg canvas
without touching pyplot's global state, so importing or calling this never opens a window.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym._durable import atomic_write_text, temp_path
from agentgym._errors import ConfigError
from agentgym._trajectory import read_whole_lines
from agentgym.runs._folder import SFT_SUMMARY, read_json, sft_figures

from ._export import best_checkpoint  # the choice `agentgym export --best` makes
from ._health import Finding, diagnose, diagnose_episodes, format_findings
from ._run_dir import figures_before_training, read_jsonl_records

#: Per-reward-function means, as `episode_metrics` names them (``reward/<name>/mean``).
_FUNCTION_MEAN = re.compile(r"^reward/(.+)/mean$")
#: Headline figures in the order a reader expects them; other figures follow.
_FIGURE_ORDER = ("base/success", "sft/success", "grpo/success")
_FIGURE_LABELS = {"base/success": "base", "sft/success": "after SFT", "grpo/success": "after GRPO"}


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that have ``key``."""
    points = [(int(r["step"]), float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
    return [s for s, _ in points], [v for _, v in points]


def plot_curves(
    metrics_jsonl: str | os.PathLike[str], out_png: str | os.PathLike[str], title: str
) -> Path:
    """Draw training reward (mean ± std, and each reward function's mean) and eval success.

    Left panel: ``reward/mean`` per step with a ``reward/std`` band, plus ``reward/<f>/mean``
    for each reward function. Right panel: ``eval/success`` per step, and the final eval
    (``final/success``) as a marker. A run with no metrics yet still gets a figure that
    says so. The PNG is written atomically. Returns ``out_png``.

    Raises:
        ConfigError: matplotlib is not installed (``pip install matplotlib``).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise ConfigError(f"the reward curve needs matplotlib: pip install matplotlib ({exc})") \
            from exc

    rows = read_jsonl_records(metrics_jsonl)
    figure = Figure(figsize=(11, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    train, evals = figure.subplots(1, 2)
    figure.suptitle(title)
    for axes in (train, evals):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))

    steps, mean = _series(rows, "reward/mean")
    train.set(title="training reward", xlabel="step", ylabel="reward")
    if steps:
        train.plot(steps, mean, label="reward (mean)", color="C0", linewidth=2)
        std_steps, std = _series(rows, "reward/std")
        if std_steps == steps:
            low = [m - s for m, s in zip(mean, std)]
            high = [m + s for m, s in zip(mean, std)]
            train.fill_between(steps, low, high, color="C0", alpha=0.15, label="± std")
        names = sorted({m.group(1) for r in rows for k in r if (m := _FUNCTION_MEAN.match(k))})
        for i, name in enumerate(names, start=1):
            train.plot(*_series(rows, f"reward/{name}/mean"), label=name, color=f"C{i}",
                       linewidth=1, linestyle="--")  # fmt: skip
        train.legend(loc="best", fontsize="small")
    else:
        train.text(0.5, 0.5, "no training steps yet", ha="center", va="center",
                   transform=train.transAxes)  # fmt: skip

    evals.set(title="held-out success", xlabel="step", ylabel="success", ylim=(-0.02, 1.02))
    eval_steps, success = _series(rows, "eval/success")
    final_steps, final = _series(rows, "final/success")
    if eval_steps:
        evals.plot(eval_steps, success, marker="o", color="C2", label="eval")
    if final_steps:
        evals.plot(final_steps, final, marker="*", markersize=14, linestyle="none", color="C3",
                   label=f"final {final[-1]:.0%}")  # fmt: skip
    if eval_steps or final_steps:
        evals.legend(loc="best", fontsize="small")
    else:
        evals.text(0.5, 0.5, "no evals yet", ha="center", va="center", transform=evals.transAxes)

    out = Path(out_png)
    tmp = temp_path(out)  # a kill while it is written leaves it: a resume removes it
    try:
        figure.savefig(tmp, format="png")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def summarize(
    rows: Sequence[Mapping[str, Any]],
    figures: Mapping[str, float],
    warm_start: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary of a run's metrics rows and headline ``figures`` (JSON-ready).

    ``warm_start``: the SFT warm start's record (`read_warm_start`), for its health rule and
    its figures (``warm_start``: steps, validation traces carried out, loss; `runs compare`
    shows them as ``warm_start/...``).
    """
    steps, reward = _series(rows, "reward/mean")
    eval_steps, success = _series(rows, "eval/success")
    times = {
        key.removeprefix("time/"): round(sum(_series(rows, key)[1]), 3)
        for key in sorted({k for r in rows for k in r if k.startswith("time/")})
    }
    summary: dict[str, Any] = {
        "figures": dict(figures),
        "steps": max(steps) if steps else 0,
        "reward": {"first": reward[0], "last": reward[-1], "best": max(reward)} if reward else None,
        "eval_success": [[s, v] for s, v in zip(eval_steps, success)],
        "seconds": times,
    }
    if steps and "sync" in times:
        summary["sync_seconds_per_step"] = round(times["sync"] / len(steps), 4)
    _, calls = _series(rows, "rollout/tool_calls_per_episode")
    if calls:
        summary["tool_calls_per_episode"] = {"first": calls[0], "last": calls[-1]}
    if warm_start is not None:
        history = warm_start.get("history")
        sft_steps = len(history) if isinstance(history, list) else 0
        measured = {k: v for k, v in sft_figures(warm_start).items() if v is not None}
        summary["warm_start"] = {"steps": sft_steps, **measured}
    findings = diagnose(rows, figures, warm_start)
    summary["findings"] = [f.as_dict() for f in findings]
    summary["health"] = {"findings": len(findings)}  # a number: the runs index shows it
    return summary


def read_warm_start(run_dir: Path) -> dict[str, Any] | None:
    """The SFT record in ``run_dir``; None without one, or unreadable.

    A train run's warm start keeps it in ``sft/sft.json``, an ``agentgym sft`` run in ``sft.json``.
    """
    for path in (run_dir / "sft" / SFT_SUMMARY, run_dir / SFT_SUMMARY):
        if isinstance(record := read_json(path), dict):
            return record
    return None


def _warm_start_line(summary: Mapping[str, Any]) -> str | None:
    """What the warm start learned: steps and the share of validation traces carried out."""
    warm_start = summary.get("warm_start")
    if not isinstance(warm_start, Mapping):
        return None
    line = f"  warm start        {warm_start['steps']} SFT steps"
    if "reference_accuracy" in warm_start:
        line += (f", validation traces carried out {warm_start['reference_accuracy']:.0%} "
                 "(teacher forced)")  # fmt: skip
    return line


def _better_checkpoint_line(run_dir: Path) -> str | None:
    """A kept checkpoint whose eval beat the last step's, and how to export it; else None.

    Why: success can peak before the last step, and a user reading only the final figure
    would deploy the weaker adapter.
    """
    try:
        step, _, chosen = best_checkpoint(run_dir)
    except ConfigError:  # no checkpoint, or none evaluated comparably
        return None
    scores: dict[str, float] = chosen["eval_success"]
    best, last = str(step), max(scores, key=int)
    if best == last:
        return None
    return (f"  best checkpoint   step {best}: {scores[best]:.0%} against step {last}'s "
            f"{scores[last]:.0%} on {chosen['eval_tasks']} held-out tasks; "
            f"agentgym export {run_dir} OUT --best")  # fmt: skip


def format_summary(run_dir: Path, summary: Mapping[str, Any]) -> str:
    """The printable block: headline figures, reward change, time split, where the curve is."""
    figures: Mapping[str, float] = summary["figures"]
    lines = [f"run {run_dir}  ({summary['steps']} GRPO steps)"]
    ordered = [k for k in _FIGURE_ORDER if k in figures] + \
        [k for k in figures if k not in _FIGURE_ORDER]
    if ordered:
        lines.append("  held-out success  " + "  ->  ".join(
            f"{_FIGURE_LABELS.get(k, k)} {_percent_or_number(figures[k])}" for k in ordered
        ))  # fmt: skip
    warm_start = _warm_start_line(summary)
    if warm_start:
        lines.append(warm_start)
    calls = summary.get("tool_calls_per_episode")
    if calls:
        lines.append(f"  tool calls        {calls['first']:.2f} per episode (first step) -> "
                     f"{calls['last']:.2f} (last)")  # fmt: skip
    reward = summary.get("reward")
    if reward:
        lines.append(f"  reward            {reward['first']:.3f} (first step) -> "
                     f"{reward['last']:.3f} (last), best {reward['best']:.3f}")  # fmt: skip
    seconds = summary.get("seconds") or {}
    if seconds:
        split = "  ".join(f"{k} {v:.1f}s" for k, v in seconds.items())
        lines.append(f"  time              {split}")
    better = _better_checkpoint_line(run_dir)
    if better:
        lines.append(better)
    curve = run_dir / "reward_curve.png"
    if curve.is_file():
        lines.append(f"  curve             {curve}")
    lines += format_findings([Finding(**f) for f in summary.get("findings", ())])
    return "\n".join(lines)


def _percent_or_number(value: float) -> str:
    return f"{value:.1%}" if 0.0 <= value <= 1.0 else f"{value:.4g}"


def run_findings(run_dir: str | os.PathLike[str]) -> list[Finding]:
    """The health findings of a run folder, finished, running or killed; an eval's or sft's too.

    A finished run's headline figures come from its ``summary.json``; a run without one gets
    them from ``metrics.jsonl`` (the base model's, the step-0 eval's, the final eval's), so a
    killed run is read as far as it got.

    Raises:
        ConfigError: the folder holds no ``metrics.jsonl``, ``trajectories.jsonl`` or
            ``sft.json``; or a line of one is not a record.
    """
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    episodes = run_dir / "trajectories.jsonl"
    if not metrics.is_file() and episodes.is_file():  # an eval's folder: its episodes, whole
        return diagnose_episodes(read_whole_lines(episodes))
    if not metrics.is_file() and (sft := read_warm_start(run_dir)) is not None:
        return diagnose([], warm_start=sft)  # an `agentgym sft` run's OUT: no steps
    if not metrics.is_file():
        raise ConfigError(f"{run_dir} holds no metrics.jsonl, trajectories.jsonl or sft.json: "
                          "`agentgym runs doctor` reads a train run's folder (its output_dir), "
                          "an eval's (its --out) or a finished sft run's (its OUT)")  # fmt: skip
    rows = read_jsonl_records(metrics)  # a damaged line: a one-line ConfigError naming it
    try:  # read_json: a regular file only (a FIFO there hung the dashboard's health view)
        figures = read_json(run_dir / "summary.json")["figures"]
    except (KeyError, TypeError):
        figures = _figures_from_rows(rows, run_dir)
    return diagnose(rows, figures, read_warm_start(run_dir))


def _figures_from_rows(rows: Sequence[Mapping[str, Any]], run_dir: Path) -> dict[str, float]:
    """The headline figures a run without ``summary.json`` has written into its rows."""
    warm_started = (run_dir / "sft" / SFT_SUMMARY).is_file()  # a train run's warm start
    figures = figures_before_training(rows, "sft/success" if warm_started else "base/success")
    finals = [float(r["final/success"]) for r in rows if isinstance(r.get("final/success"),
                                                                   (int, float))]  # fmt: skip
    return figures | ({"grpo/success": finals[-1]} if finals else {})


def write_summary(run_dir: str | os.PathLike[str], figures: Mapping[str, float]) -> str:
    """Write ``summary.json`` and ``summary.txt`` into ``run_dir``; returns the text block.

    ``figures`` are the headline numbers (``base/success``, ``sft/success``,
    ``grpo/success``, ...); the rest is read from ``metrics.jsonl``.
    """
    run_dir = Path(run_dir)
    rows = read_jsonl_records(run_dir / "metrics.jsonl")
    summary = summarize(rows, figures, read_warm_start(run_dir))
    text = format_summary(run_dir, summary)
    summary["text"] = text
    # whole or not at all: a kill cutting summary.json short made `--resume` refuse the run
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
    atomic_write_text(run_dir / "summary.txt", text + "\n")
    return text
