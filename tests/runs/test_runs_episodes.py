"""``agentgym runs episodes``: a run's episodes read in full in a terminal, filtered as the
dashboard's viewer filters them.

Before it, reading episodes (how reward hacking is caught) needed ``agentgym serve`` and a
browser, which a training box reached over SSH seldom has. The real console script, with a
database per test (``AGENTGYM_RUNS_DB``), on a real ``agentgym eval`` run and on a file of
hand-made episodes that holds every status the filters tell apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgym import Trajectory
from agentgym._trajectory import Turn, to_json_line
from tests.conftest import require
from tests.runs.cli import agentgym

require("sqlalchemy")
from agentgym.runs import RunStore  # noqa: E402


def test_an_eval_runs_episodes_print_in_full_by_its_run_id(tmp_path: Path, db: str) -> None:
    played = agentgym("eval", "calculator", "--policy", "reference", "-n", "3",
                      "--out", tmp_path / "ev", db=db)  # fmt: skip
    assert played.returncode == 0, played.stderr
    [run] = RunStore(db).list_runs()
    shown = agentgym("runs", "episodes", run["id"][:8], "--limit", "2", db=db)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert out.count("[user]\nWhat is ") == 2 and out.count("[tool calculate]\n") == 2
    assert (
        "#0 · task " in out
        and "· group 0 · ok · reward 1 (correct_answer 1, used_calculator 1)" in out
    )
    assert "-> calculate({" in out and "[assistant]\nThe answer is " in out
    assert "episodes 1-2 of 3 matching (3 in " in out and "the next: --offset 2" in out
    last = agentgym("runs", "episodes", tmp_path / "ev", "--offset", "2", db=db)  # by folder
    assert last.returncode == 0, last.stderr
    assert "#2 · task " in last.stdout and "#0 ·" not in last.stdout  # lines in finish order
    assert "episodes 3-3 of 3 matching" in last.stdout and "--offset" not in last.stdout


def test_results_cut_picks_the_episodes_whose_model_read_a_cut_tool_result(
    tmp_path: Path, db: str
) -> None:
    """What the ``tool-results-cut`` finding points at: a real eval whose results were cut at
    ``max_tool_result_chars``, and one whose were not, in one file."""
    for name, cap in (("cut", "1"), ("whole", "100")):
        cap_arg = f"max_tool_result_chars={cap}"
        played = agentgym("eval", "calculator", "--policy", "reference", "-n", "2", "--env-arg",
                          cap_arg, "--out", tmp_path / name, db=db)  # fmt: skip
        assert played.returncode == 0, played.stderr
    both = tmp_path / "both.jsonl"
    both.write_text(
        "".join((tmp_path / n / "trajectories.jsonl").read_text() for n in ("whole", "cut"))
    )
    shown = agentgym("runs", "episodes", both, "--results-cut", "--limit", "9", db=db)
    assert shown.returncode == 0, shown.stderr
    assert "episodes 1-2 of 2 matching (4 in " in shown.stdout
    assert shown.stdout.count("· tool results cut 1") == 2
    everything = agentgym("runs", "episodes", both, "--limit", "9", db=db)
    assert everything.stdout.count("· tool results cut") == 2  # said only where it happened


def test_turns_cut_picks_the_episodes_with_a_turn_at_the_token_limit(
    tmp_path: Path, db: str
) -> None:
    """The turns-cut finding's command: when every turn is cut alike, no length is an
    outlier, and --length-outliers showed nothing."""
    cut = episode("ok", 0.0, "<tool_call>{\"name\": \"calc")
    cut.turns[0].finish_reason = "length"
    whole = episode("ok", 1.0, "The answer is 42.")
    whole.turns[0].finish_reason = "stop"
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(to_json_line(t) + "\n" for t in (whole, cut, cut)))
    shown = agentgym("runs", "episodes", path, "--turns-cut", "--limit", "9", db=db)
    assert shown.returncode == 0, shown.stderr
    assert "episodes 1-2 of 2 matching (3 in " in shown.stdout
    assert shown.stdout.count("· turns cut 1") == 2 and "The answer is 42." not in shown.stdout


def episode(status: str, reward: float, reply: str, error: str | None = None) -> Trajectory:
    """A one-turn episode whose assistant wrote ``reply``, scored ``reward``."""
    messages = [{"role": "user", "content": "What is 6 * 7?"},
                {"role": "assistant", "content": reply}]  # fmt: skip
    return Trajectory(
        env_id="agentgym/Calculator-v0", task_index=0, messages=messages,
        turns=[Turn(text=reply, completion_ids=[5] * 4)], final_reward=reward,
        scores={"correct_answer": reward}, status=status, error=error,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """Four episodes of four outcomes and one line that is not a trajectory."""
    path = tmp_path / "trajectories.jsonl"
    lines = [
        to_json_line(episode("ok", 1.0, "The answer is 42.")),
        to_json_line(episode("ok", 0.0, "\n" * 12)),  # the untrained tiny model's habit
        "{not json\n",
        to_json_line(episode("error", 0.0, "", error="the tool server went away")),
        to_json_line(episode("truncated", 0.0, "I think")),
    ]
    path.write_text("".join(line if line.endswith("\n") else line + "\n" for line in lines))
    return path


def test_filters_pick_what_the_dashboard_would_and_say_what_they_left(mixed: Path, db: str) -> None:
    failed = agentgym("runs", "episodes", mixed, "--status", "error", db=db)
    assert failed.returncode == 0, failed.stderr
    assert "· error · reward 0" in failed.stdout
    assert "error: the tool server went away" in failed.stdout
    assert "episodes 1-1 of 1 matching (4 in " in failed.stdout
    assert "1 lines are not trajectories" in failed.stdout  # counted, never silently dropped
    blank = agentgym("runs", "episodes", mixed, "--status", "ok", "--max-reward", "0", db=db)
    assert blank.returncode == 0, blank.stderr
    # whitespace alone used to print as nothing: the reader could not see what was written
    assert "[assistant]\n(only whitespace, 12 characters: '\\n\\n\\n" in blank.stdout
    assert "The answer is 42." not in blank.stdout
    both = agentgym("runs", "episodes", mixed, "--status", "ok", "--status", "truncated",
                    "--min-reward", "0", "--limit", "9", db=db)  # fmt: skip
    assert "of 3 matching" in both.stdout and "error: " not in both.stdout
    none = agentgym("runs", "episodes", mixed, "--min-reward", "2", db=db)
    assert none.returncode == 0 and "no episode to show: 0 match (4 in " in none.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--status", "done"], "--status 'done' is not a status; use one of ok, truncated"),
        (["nowhere-run"], "no run with id 'nowhere-run'"),
    ],
)
def test_a_mistake_is_one_line_naming_the_fix(
    mixed: Path, db: str, args: list[str], says: str
) -> None:
    target = [] if args[0] == "nowhere-run" else [mixed]
    refused = agentgym("runs", "episodes", *target, *args, db=db)
    assert refused.returncode == 2
    assert says in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_a_folder_without_episodes_names_the_files_it_looked_for(tmp_path: Path, db: str) -> None:
    refused = agentgym("runs", "episodes", tmp_path, db=db)
    assert refused.returncode == 2
    assert "holds no eval_trajectories.jsonl or trajectories.jsonl yet" in refused.stderr
