"""Run health: each troubleshooting rule fires on the figures it names, and not on a healthy run.

The rows are metrics.jsonl rows as the trainer writes them (the keys of `episode_metrics`, the
loss and the sampling figures); a healthy run is shaped like the quickstart's (reward rising,
a quarter of groups flat, one call per episode).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentgym import Trajectory, Turn
from agentgym._errors import ConfigError
from agentgym._summary import ONE_REWARD_KEY
from agentgym._trajectory import to_json_line
from agentgym.trainers import _health
from agentgym.trainers._health import HealthWatch, diagnose
from agentgym.trainers._report import run_findings, write_summary
from tests.runs.cli import agentgym

REPO = Path(__file__).resolve().parents[2]
Value = float | Callable[[int], float]


def healthy(step: int) -> dict[str, Any]:
    """One training step of a run that learns: success and reward rise, entropy stays."""
    rise = min(1.0, 0.1 + 0.06 * step)
    return {
        "step": step, "data/tasks": [step], "reward/mean": rise, "reward/std": 0.3,
        "reward/success": rise, "reward/correct_answer/mean": rise,
        "reward/used_calculator/mean": min(1.0, rise + 0.1),
        "reward/frac_zero_variance_groups": 0.25, "rollout/tool_calls_per_episode": 1.0,
        "rollout/turns_per_episode": 2.0, "rollout/tool_error_rate": 0.02,
        "rollout/frac_truncated": 0.0, "rollout/frac_infra_error": 0.0, "rollout/frac_late": 0.0,
        "rollout/frac_error": 0.0, "rollout/frac_turns_cut": 0.05,
        "sampling/logprob_drift_mean": 1e-6, "loss/clip_ratio_region": 0.01,
        "train/skipped_updates": 0.0,
        "loss/entropy": 0.3 - 0.005 * step, "loss/kl": 0.01,
    }  # fmt: skip


def run_rows(steps: int = 12, **changed: Value) -> list[dict[str, Any]]:
    """A step-0 eval row, then ``steps`` training rows; ``changed`` keys (``/`` written ``__``)
    take a value, or a function of the step."""
    rows: list[dict[str, Any]] = [{"step": 0, "eval/success": 0.1}]
    for step in range(1, steps + 1):
        row = healthy(step)
        for key, value in changed.items():
            row[key.replace("__", "/")] = value(step) if callable(value) else value
        rows.append(row)
    return rows


def rewards_at(level: Value, **changed: Value) -> list[dict[str, Any]]:
    """`run_rows` whose success, reward and both reward functions all read ``level``."""
    return run_rows(reward__success=level, reward__mean=level, reward__correct_answer__mean=level,
                    reward__used_calculator__mean=level, **changed)  # fmt: skip


def rules(rows: list[dict[str, Any]], figures: dict[str, float] | None = None) -> list[str]:
    return [f.rule for f in diagnose(rows, figures)]


HEALTHY_FIGURES = {"base/success": 0.0, "sft/success": 0.1, "grpo/success": 0.9}

#: rule -> (rows, headline figures, a fragment the finding's text must hold)
CASES: dict[str, tuple[list[dict[str, Any]], dict[str, float], str]] = {
    "infra-errors": (run_rows(rollout__frac_infra_error=0.25), HEALTHY_FIGURES, "25% of episodes"),
    "errors": (run_rows(rollout__frac_error=0.5), HEALTHY_FIGURES, "--status error"),
    "skipped-updates": (
        run_rows(train__skipped_updates=lambda s: 1.0 if s == 2 else 0.0), HEALTHY_FIGURES,
        "1 of 12 steps skipped an update",
    ),
    "no-tool-calls": (
        run_rows(rollout__tool_calls_per_episode=0.0, rollout__turns_per_episode=1.0),
        HEALTHY_FIGURES, "agentgym check ENV --model MODEL",
    ),
    "tool-errors": (run_rows(rollout__tool_error_rate=0.6), HEALTHY_FIGURES, "60% of tool calls"),
    "turns-cut": (run_rows(rollout__frac_turns_cut=0.5), HEALTHY_FIGURES, "50% of turns ended"),
    "tool-results-cut": (
        run_rows(rollout__frac_tool_results_cut=0.2), HEALTHY_FIGURES, "max_tool_result_chars",
    ),
    "truncated": (run_rows(rollout__frac_truncated=0.4), HEALTHY_FIGURES, "max_completion_length"),
    "late": (run_rows(rollout__frac_late=0.3), HEALTHY_FIGURES, "episode_deadline_s"),
    "flat-groups": (
        rewards_at(0.0, reward__frac_zero_variance_groups=1.0), HEALTHY_FIGURES, "sft_steps",
    ),
    "logprob-drift": (
        run_rows(sampling__logprob_drift_mean=0.2), HEALTHY_FIGURES, "0.200 nats",
    ),
    "clipping": (run_rows(loss__clip_ratio_region=0.35), HEALTHY_FIGURES, "35% of tokens"),
    "kl": (run_rows(loss__kl=1.5), HEALTHY_FIGURES, "raise beta"),
    "entropy-collapse": (
        rewards_at(0.3, loss__entropy=lambda s: 0.5 if s <= 4 else 0.01), HEALTHY_FIGURES,
        "0.500 -> 0.010",
    ),
    "entropy-rises": (
        rewards_at(0.1, loss__entropy=lambda s: 0.2 if s <= 4 else 1.9), HEALTHY_FIGURES,
        "entropy 0.200 -> 1.900 while reward/success went 0.10 -> 0.10",
    ),
    "reward-falls": (
        rewards_at(lambda s: 0.8 - 0.05 * s), HEALTHY_FIGURES, "over the recent ones",
    ),
    "reward-parts-diverge": (
        run_rows(reward__correct_answer__mean=0.2, reward__success=lambda s: 0.2 + 0.001 * s),
        HEALTHY_FIGURES, "used_calculator rises, correct_answer does not",
    ),
    "train-up-eval-flat": (
        [*run_rows()[:10], {"step": 9, "eval/success": 0.1}, *run_rows()[10:]],
        HEALTHY_FIGURES, "0.22 -> 0.58 in training up to step 9; eval/success 10% at step 0",
    ),
    "worse-than-start": (
        run_rows(), {"base/success": 0.0, "sft/success": 0.6, "grpo/success": 0.4},
        "sft/success 60% -> grpo/success 40%",
    ),
    "warm-start-short": (
        run_rows(), HEALTHY_FIGURES,
        "all 30 SFT steps run, validation traces carried out 70% (target 90%)",
    ),
}


def sft_record(steps: int, cap: int, accuracy: float, target: float | None = 0.9) -> dict[str, Any]:
    """A warm start's ``sft.json`` as `sft_warm_start` writes it: ``steps`` of ``cap`` run, the
    last one measuring ``accuracy`` of validation traces carried out."""
    history: list[dict[str, Any]] = [{"step": s, "loss": 1.0 / s} for s in range(1, steps + 1)]
    history[-1]["reference_accuracy"] = accuracy
    return {"config": {"steps": cap, "target_accuracy": target}, "history": history}


#: rule -> the warm start its case needs (the others have none)
WARM_STARTS = {"warm-start-short": sft_record(30, 30, 0.7)}


def test_a_healthy_run_matches_no_rule() -> None:
    assert rules(run_rows(), HEALTHY_FIGURES) == []


@pytest.mark.parametrize("rule", list(CASES))
def test_each_rule_fires_on_the_figures_it_names(rule: str) -> None:
    rows, figures, fragment = CASES[rule]
    findings = diagnose(rows, figures, WARM_STARTS.get(rule))
    assert [f.rule for f in findings] == [rule]
    assert fragment in findings[0].text()


def test_every_rule_has_a_case_here_and_a_section_in_the_docs() -> None:
    assert len(CASES) == len(_health.RULES)  # each case fires its own rule alone (above)
    docs = (REPO / "docs/troubleshooting.md").read_text()
    anchors = set(re.findall(r'<a id="([a-z-]+)"></a>', docs))
    assert set(CASES) <= anchors, f"rules without a section: {set(CASES) - anchors}"


def test_flat_groups_says_which_way_the_run_is_stuck() -> None:
    solved = diagnose(run_rows(reward__frac_zero_variance_groups=1.0, reward__success=1.0,
                               reward__mean=1.0))  # fmt: skip
    assert solved[0].title == "every episode succeeds: the train tasks are solved"
    paid = diagnose(run_rows(reward__frac_zero_variance_groups=1.0, reward__success=0.0,
                             reward__mean=1.0))  # every episode paid, none a success
    assert paid[0].title == "episodes are paid alike, yet none succeeds"
    assert "'reward of wrong answers'" in paid[0].fix
    assert "(reward/mean 1.00, reward/success 0.00)" in paid[0].evidence
    same = diagnose(run_rows(reward__frac_zero_variance_groups=1.0, reward__success=0.24,
                             reward__mean=1.0, reward__std=0.0))  # the gameable calculator's
    assert same[0].title == "every episode is paid the same"
    assert same[0].evidence.endswith("(reward/mean 1.00, reward/success 0.24), reward/std 0")
    alike = diagnose(run_rows(reward__frac_zero_variance_groups=0.95))
    assert [f.rule for f in alike] == ["flat-groups"] and "temperature" in alike[0].fix


def test_nothing_succeeding_after_a_warm_start_asks_for_a_longer_one_not_for_one() -> None:
    """It advised "an SFT warm start (sft_steps: 200)" to a run that had warmed up 300 steps."""
    stuck = rewards_at(0.0, reward__frac_zero_variance_groups=1.0)
    [cold] = diagnose(stuck)
    assert "an SFT warm start (sft_steps: 200)" in cold.fix
    [warmed] = diagnose(stuck, warm_start=sft_record(300, 300, 0.0, target=None))
    assert "a longer or stronger warm start (it ran 300 SFT steps: raise sft_steps" in warmed.fix
    assert "(sft_steps: 200)" not in warmed.fix


def test_nothing_is_judged_before_three_steps_nor_from_one_bad_step() -> None:
    assert rules(run_rows(steps=2, rollout__tool_error_rate=0.9)) == []
    one_bad = run_rows(rollout__tool_error_rate=lambda s: 0.9 if s == 12 else 0.0)
    assert rules(one_bad) == []  # 0.9 in one of the last 4 steps: 22% on average
    non_finite = run_rows(rollout__tool_error_rate=float("nan"))
    assert rules(non_finite) == []


def test_the_watch_reports_each_rule_once_as_soon_as_it_shows() -> None:
    rows = run_rows(rollout__tool_error_rate=lambda s: 0.0 if s < 5 else 0.8)
    watch = HealthWatch(rows[:1])  # the step-0 eval, as the trainer starts it
    reported = {row["step"]: [f.rule for f in watch.see(row["step"], row)] for row in rows[1:]}
    assert reported[5] == [] and reported[6] == ["tool-errors"]  # 2 of the last 3 steps
    assert all(found == [] for step, found in reported.items() if step != 6)


def test_a_long_run_is_checked_every_fiftieth_of_its_length(monkeypatch) -> None:
    checked: list[int] = []

    def counting(history: _health.History) -> None:
        checked.append(history.steps[-1]["step"])

    monkeypatch.setattr(_health, "RULES", (counting,))
    watch = HealthWatch()
    for row in run_rows(steps=240)[1:]:
        watch.see(row["step"], row)
    assert checked[:98] == list(range(3, 101))  # every step while the run is short
    assert checked[98:100] == [102, 104] and checked[-1] == 240  # then every 2nd, ...
    assert max(b - a for a, b in zip(checked, checked[1:])) <= 240 // 50  # at most 2% late
    assert len(checked) < 160  # of the 238 steps judged


def test_a_rule_that_raises_quiets_the_watch_and_not_the_run(monkeypatch, caplog) -> None:
    def broken(history: _health.History) -> None:
        raise KeyError("step")

    monkeypatch.setattr(_health, "RULES", (broken, *_health.RULES))
    watch, rows = HealthWatch(), run_rows(rollout__tool_error_rate=0.9)
    assert [watch.see(row["step"], row) for row in rows[1:]] == [[]] * 12
    assert caplog.text.count("the health watch stopped at step 3 (the run goes on)") == 1


def write_run(folder: Path, rows: list[dict[str, Any]], sft_steps: int) -> Path:
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump({"sft_steps": sft_steps}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if sft_steps:  # what a warm start leaves in the run folder
        (folder / "sft").mkdir()
        (folder / "sft" / "sft.json").write_text(json.dumps({"history": []}))
    return folder


def test_a_killed_run_is_read_from_its_rows_and_a_finished_one_from_its_summary(
    tmp_path: Path,
) -> None:
    rows = [{"step": 0, "base/success": 0.0}, *run_rows(), {"step": 12, "final/success": 0.2}]
    rows[1]["eval/success"] = 0.7  # the step-0 eval: the warm start's model
    killed = write_run(tmp_path / "killed", rows, sft_steps=100)
    found = {f.rule: f for f in run_findings(killed)}
    assert list(found) == ["train-up-eval-flat", "worse-than-start"]  # the final eval counts
    assert found["worse-than-start"].evidence == "sft/success 70% -> grpo/success 20%"
    assert "eval/success 70% at step 0, at most 20% after" in found["train-up-eval-flat"].evidence
    no_warm_start = write_run(tmp_path / "plain", rows, sft_steps=0)  # step 0 is the base's
    assert run_findings(no_warm_start)[-1].evidence == "base/success 70% -> grpo/success 20%"
    text = write_summary(killed, {"sft/success": 0.7, "grpo/success": 0.8})
    assert "worse-than-start" not in text  # summary.json's figures win over the rows
    assert [f.rule for f in run_findings(killed)] == ["train-up-eval-flat"]
    with pytest.raises(ConfigError, match="holds no metrics.jsonl, trajectories.jsonl or sft.json"):
        run_findings(tmp_path)


def test_the_summary_lists_the_findings(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", run_rows(rollout__frac_truncated=0.5), sft_steps=0)
    text = write_summary(run, HEALTHY_FIGURES)
    assert "    [truncated] episodes run out of room: 50% of episodes" in text
    summary = json.loads((run / "summary.json").read_text())
    assert summary["findings"][0]["rule"] == "truncated"
    assert summary["health"] == {"findings": 1}
    from agentgym.runs._folder import read_figures

    assert read_figures(run)["health/findings"] == 1  # what `runs ls` and `runs compare` show


def test_cli_doctor_exits_1_with_findings_and_0_without(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    sick = write_run(tmp_path / "sick", run_rows(rollout__tool_error_rate=0.5), sft_steps=0)
    found = agentgym("runs", "doctor", sick, db=db)
    assert found.returncode == 1, found.stderr
    assert "[tool-errors] many tool calls fail" in found.stdout
    assert "agentgym runs episodes RUN --tool-errors" in found.stdout
    well = write_run(tmp_path / "well", run_rows(), sft_steps=0)
    fine = agentgym("runs", "doctor", well, db=db)
    assert fine.returncode == 0 and "no known problem" in fine.stdout
    with (well / "metrics.jsonl").open("a") as f:
        f.write("{not json\n" + json.dumps(run_rows()[1]) + "\n")
    torn = agentgym("runs", "doctor", well, db=db)
    assert torn.returncode == 2 and "metrics.jsonl is not a record (not JSON" in \
        torn.stderr and "Traceback" not in torn.stderr  # fmt: skip
    missing = agentgym("runs", "doctor", "nosuchrun", db=db)
    assert missing.returncode == 2 and "no run with id 'nosuchrun'" in missing.stderr


def test_a_warm_start_is_short_only_when_it_used_every_step_below_its_target() -> None:
    rows = run_rows()
    assert rules(rows) == []
    for fine in (sft_record(12, 30, 0.7),  # stopped early: it reached its target then
                 sft_record(30, 30, 0.95),  # reached it at the last step
                 sft_record(30, 30, 0.5, target=None),  # no target given: nothing to fall short of
                 {"config": {}, "history": []}, {}):  # fmt: skip
        assert [f.rule for f in diagnose(rows, HEALTHY_FIGURES, fine)] == [], fine
    assert rules(rows[:3]) == []  # two steps: too few for the rules that read steps
    # the warm start ended before the first step: a short one is named from then on, and before
    # any step (the watch's first row, an `agentgym sft` run's own folder)
    for before in (rows[:2], rows[:1], []):
        found = diagnose(before, None, WARM_STARTS["warm-start-short"])
        assert [f.rule for f in found] == ["warm-start-short"], before


def test_a_run_folders_warm_start_is_read_by_doctor_and_the_summary(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", run_rows(), sft_steps=30)
    (run / "sft" / "sft.json").write_text(json.dumps(sft_record(30, 30, 0.7)))
    assert [f.rule for f in run_findings(run)] == ["warm-start-short"]
    assert "[warm-start-short] the warm start stopped short" in write_summary(run, HEALTHY_FIGURES)
    (run / "sft" / "sft.json").write_text("{torn")  # unreadable: no finding, no crash
    assert run_findings(run) == []


def test_an_sft_runs_own_folder_is_read_by_doctor(tmp_path: Path) -> None:
    """``agentgym sft --target-accuracy``'s OUT: its ``sft.json`` alone, no steps to wait for."""
    (tmp_path / "sft.json").write_text(json.dumps(sft_record(30, 30, 0.7)))
    [finding] = run_findings(tmp_path)
    assert finding.rule == "warm-start-short" and "agentgym sft: --steps, --lr" in finding.fix
    (tmp_path / "sft.json").write_text(json.dumps(sft_record(12, 30, 0.95)))
    assert run_findings(tmp_path) == []


def test_an_eval_taken_before_the_training_gain_is_not_read_as_flat() -> None:
    """The quickstart's shape: eval at step 5 still 0%, training success climbing after it."""
    rows = run_rows(reward__success=lambda s: 0.1 if s <= 5 else 0.6)
    rows.insert(6, {"step": 5, "eval/success": 0.0})
    rows[0]["eval/success"] = 0.0
    watch = HealthWatch(rows[:1])
    fed = [(row.pop("step"), row) for row in [dict(r) for r in rows[1:]]]  # as the trainer feeds
    assert [f.rule for step, metrics in fed for f in watch.see(step, metrics)] == []
    rows.append({"step": 12, "final/success": 0.0})  # ... and the final eval did not follow
    assert rules(rows) == ["train-up-eval-flat"]


def test_every_knob_a_fix_names_is_a_config_field() -> None:
    """A fix that names a knob the config does not have sends the user nowhere."""
    import dataclasses
    import inspect
    from typing import get_args

    from agentgym import ToolEnv
    from agentgym._trajectory import Status
    from agentgym.trainers import GRPOConfig

    # and the tool env's own knobs, which a run sets in env_kwargs
    fields = {f.name for f in dataclasses.fields(GRPOConfig)} | set(
        inspect.signature(ToolEnv.__init__).parameters
    )
    findings = [f for rule, (rows, figures, _) in CASES.items()
                for f in diagnose(rows, figures, WARM_STARTS.get(rule))]  # fmt: skip
    findings += diagnose(run_rows(reward__frac_zero_variance_groups=0.95))  # the generic form
    named = {word for f in findings for word in re.findall(r"\b[a-z]+_[a-z_]+\b", f.fix)}
    not_knobs = set(get_args(Status)) | {"used_calculator", "correct_answer"}  # reward functions
    assert named - not_knobs - fields == set(), "knobs named in a fix that GRPOConfig lacks"
    assert {"learning_rate", "max_completion_length", "sft_steps", "episode_deadline_s"} <= named
    docs = (REPO / "docs/troubleshooting.md").read_text()
    in_docs = set(re.findall(r"`([a-z]+_[a-z_]+)(?:: [^`]*)?`", docs))  # `knob` or `knob: value`
    assert in_docs - fields == set() and len(in_docs) > 10, "knobs in the docs GRPOConfig lacks"


# ---- an eval's episodes ---------------------------------------------------------------------


def eval_episode(status: str = "ok", *, calls: int = 1, errors: int = 0, cut: bool = False,
                 task: int | None = None, reward: float = 1.0) -> Trajectory:  # fmt: skip
    """One played episode: ``calls`` tool calls (``errors`` of them failed), then an answer;
    ``task``: its task index (each episode its own task by default, as with ``-g 1``)."""
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add"}}]}
    messages = [call, {"role": "tool", "content": "3"}] * calls
    turns = [Turn(completion_ids=[1, 2], tool_errors=["bad"] * errors) for _ in range(calls)]
    turns.append(Turn(completion_ids=[3], finish_reason="length" if cut else "stop"))
    return Trajectory(env_id="x", status=status, final_reward=reward, turns=turns,
                      task_index=next(_TASKS) if task is None else task,
                      messages=[*messages, {"role": "assistant", "content": "3"}])  # fmt: skip


_TASKS = itertools.count(1000)  # the task indices of `eval_episode`s given none


def test_an_evals_episodes_are_judged_whole_with_the_evals_own_fixes() -> None:
    assert _health.diagnose_episodes([eval_episode() for _ in range(4)]) == []
    assert _health.diagnose_episodes([]) == []
    [silent] = _health.diagnose_episodes([eval_episode(calls=0) for _ in range(4)])
    assert silent.rule == "no-tool-calls"
    assert silent.evidence == "0 tool calls and 1 turn per episode in this eval"
    assert "a warm start (`agentgym sft`)" in silent.fix and "--temperature" in silent.fix
    sick = [eval_episode(errors=1, cut=True), eval_episode("truncated", errors=1),
            eval_episode("infra_error"), eval_episode()]  # fmt: skip
    found = {f.rule: f for f in _health.diagnose_episodes(sick)}
    assert list(found) == ["infra-errors", "turns-cut", "tool-errors", "truncated"]  # RULES order
    assert found["infra-errors"].evidence.startswith("25% of episodes ended as infra_error")
    assert found["tool-errors"].evidence.startswith("67% of tool calls were errors in this eval")
    assert "--concurrency" in found["infra-errors"].fix and "max_concurrency" not in str(found)


#: An eval's figures that fire each episode rule (flat-groups in each of its forms).
EVAL_TRIGGERS: list[tuple[str, dict[str, float]]] = [
    ("infra-errors", {"rollout/frac_infra_error": 1.0}),
    ("errors", {"rollout/frac_error": 1.0}),
    ("no-tool-calls", {"rollout/tool_calls_per_episode": 0.0, "rollout/turns_per_episode": 1.0}),
    ("turns-cut", {"rollout/frac_turns_cut": 1.0}),
    ("tool-errors", {"rollout/tool_error_rate": 1.0}),
    ("tool-results-cut", {"rollout/frac_tool_results_cut": 1.0}),
    ("truncated", {"rollout/frac_truncated": 1.0}),
    ("flat-groups", {ONE_REWARD_KEY: 1.0, "reward/mean": 0.0, "reward/success": 0.0}),
    ("flat-groups", {ONE_REWARD_KEY: 1.0}),  # most alike
    ("flat-groups", {ONE_REWARD_KEY: 1.0, "reward/std": 0.0}),  # paid the same
    ("flat-groups", {ONE_REWARD_KEY: 1.0, "reward/success": 0.0}),  # paid, none succeeds
]


def test_every_option_an_eval_fix_names_is_an_option_of_its_command() -> None:
    """An eval fix names `agentgym eval`'s options, or `runs episodes`'s after its command,
    and reads the eval's folder (OUT), not a train run's (RUN)."""
    from typer.main import get_command

    from agentgym.cli import app

    commands = get_command(app).commands  # type: ignore[attr-defined]
    options = {name: {o for p in command.params for o in p.opts}
               for name, command in [("eval", commands["eval"]),
                                     ("episodes", commands["runs"].commands["episodes"])]}
    assert {rule for rule, _ in EVAL_TRIGGERS} == {r.__name__.replace("_", "-") for r in
                                                   _health.EPISODE_RULES}  # fmt: skip
    titles = set()
    for rule, figures in EVAL_TRIGGERS:
        row = {"reward/mean": 0.5, "reward/std": 0.3, "reward/success": 0.5, **figures}
        history = _health.History([row], batch=True)
        [finding] = [f for r in _health.EPISODE_RULES if (f := r(history)) is not None]
        assert finding.rule == rule and "in this eval" in finding.evidence, finding
        titles.add(finding.title)
        fix = finding.fix
        assert "RUN" not in fix and "max_completion_length" not in fix, fix
        for command_line in re.findall(r"`agentgym runs episodes OUT ([^`]*)`", fix):
            assert set(re.findall(r"--[a-z-]+", command_line)) <= options["episodes"], rule
        outside = re.sub(r"`[^`]*`", "", fix)  # options not in a quoted command: eval's
        assert set(re.findall(r"--[a-z-]+", outside)) <= options["eval"], rule
    assert len(titles) == len(EVAL_TRIGGERS)  # each form of flat-groups was reached


def test_an_eval_with_several_episodes_a_task_says_what_grpo_would_face() -> None:
    """``agentgym eval -g G`` of the model a run would start from: a check before training."""
    failing = [eval_episode(task=t, reward=0.0, calls=0) for t in range(4) for _ in range(4)]
    found = {f.rule: f for f in _health.diagnose_episodes(failing)}
    assert found["flat-groups"].title == "nothing succeeds, so nothing is learned"
    assert found["flat-groups"].evidence.startswith("100% of groups had one reward for all their "
                                                    "episodes in this eval")  # fmt: skip
    assert "--temperature" in found["flat-groups"].fix
    assert "agentgym sft" in found["flat-groups"].fix
    solved = [eval_episode(task=t) for t in range(4) for _ in range(4)]
    assert _health.diagnose_episodes(solved) == []  # a good model: nothing to report
    mixed = [eval_episode(task=t, reward=float(i == 0)) for t in range(4) for i in range(4)]
    assert _health.diagnose_episodes(mixed) == []  # every group has a winner: signal
    alike = [eval_episode(task=t, reward=float(t < 2)) for t in range(4) for _ in range(4)]
    [finding] = _health.diagnose_episodes(alike)  # half the tasks solved, each group alike
    assert finding.title == "most groups score all their episodes alike"
    assert finding.fix.startswith("sample with a higher --temperature or --group-size")


def test_doctor_reads_an_eval_folder_killed_mid_line(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    out.mkdir()
    lines = [to_json_line(eval_episode(calls=0)) for _ in range(3)]
    (out / "trajectories.jsonl").write_text("".join(lines) + lines[0][:40])  # a torn last line
    assert [f.rule for f in run_findings(out)] == ["no-tool-calls"]
    assert (out / "trajectories.jsonl").read_text().endswith(lines[0][:40])  # read, not cut


def test_steps_whose_every_episode_was_late_are_found_late_and_nothing_else() -> None:
    """Rows as the trainer writes them for such steps (`episode_metrics` and the advantages'
    figures of all-late episodes): they carried reward 0, no tool calls, one turn and every
    group flat, and the findings added no-tool-calls and flat-groups ("warm start") to late."""
    from agentgym.trainers._advantages import group_advantages
    from agentgym.trainers._metrics import episode_metrics

    late = [Trajectory(env_id="e", status="late", task_index=i // 2) for i in range(4)]
    figures = {**episode_metrics(late),
               **group_advantages([0.0] * 4, [0, 0, 1, 1], ["late"] * 4).metrics()}  # fmt: skip
    rows = [{"step": step, **figures} for step in range(1, 7)]
    assert rules(rows) == ["late"]
