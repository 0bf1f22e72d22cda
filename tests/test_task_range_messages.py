"""``agentgym eval --tasks`` mistakes: one line each, in words that fit what was written.

Why: ``--tasks -3:2`` was told to "fix the list", though the user wrote a range (the CLI
takes no list); a negative bound or an empty range is now named, with a range that plays.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym import ConfigError
from agentgym._eval_cli import checked_tasks
from agentgym._tasks import parse_tasks

AGENTGYM = Path(sys.executable).parent / "agentgym"


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("-3:2", "--tasks='-3:2' has a negative bound, but task indices start at 0 (none counts "
                 "from the end); write e.g. '0:2'"),
        ("3:-1", "--tasks='3:-1' has a negative bound, but task indices start at 0 (none counts "
                 "from the end); write e.g. '3:4'"),
        ("5:2", "--tasks='5:2' is an empty range: 'start:stop' is half-open, stop past start; "
                "write e.g. '2:5'"),
        ("3:3", "--tasks='3:3' is an empty range: 'start:stop' is half-open, stop past start; "
                "write e.g. '3:4' for task 3"),
        ("5:", "--tasks='5:' leaves out a bound: give both of a non-empty 'start:stop' range "
               "of task indices; write e.g. '5:6' for task 5"),
        (":5", "--tasks=':5' leaves out a bound: give both of a non-empty 'start:stop' range "
               "of task indices; write e.g. '0:5'"),
        ("7", "--tasks='7' is not a non-empty 'start:stop' range of task indices; write e.g. "
              "'7:8' for task 7"),
        ("-1:3000000000", "--tasks='-1:3000000000' reaches past task 10,000,000, the most "
                          "agentgym plays; pick a range inside the env's tasks"),
        ("abc", "--tasks='abc' is not a non-empty 'start:stop' range of task indices; write "
                "e.g. '100:600'"),
        ("1,1", "--tasks='1,1' is not a non-empty 'start:stop' range"),
        ("-1", "--tasks='-1' is not a non-empty 'start:stop' range"),
    ],
)  # fmt: skip
def test_a_task_range_mistake_is_one_line_that_fits_it(
    tmp_path: Path, spec: str, error: str
) -> None:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "AGENTGYM_RUNS_DB": "off"}
    proc = subprocess.run(
        [str(AGENTGYM), "eval", "agentgym/Calculator-v0", "--policy", "reference",
         f"--tasks={spec}", "--out", str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {error}")
    assert "list" not in lines[0]  # the CLI takes no list: none is to be fixed
    assert not (tmp_path / "out").exists()


def test_a_list_keeps_the_list_words_and_a_range_of_the_api_offers_one() -> None:
    with pytest.raises(ConfigError, match=r"tasks=\[-3, 2\] must hold .* fix the list"):
        parse_tasks([-3, 2])
    with pytest.raises(ConfigError, match="negative bound") as caught:
        parse_tasks("-3:2", "train_tasks")
    assert "fix the list" not in str(caught.value)
    assert parse_tasks("2:5") == [2, 3, 4]


@pytest.mark.parametrize(("name", "tasks"), [("-n", "--tasks"), ("num_tasks", "tasks")])
def test_a_range_and_a_count_together_name_both_as_their_user_wrote_them(
    name: str, tasks: str
) -> None:
    """A queued job was told to drop ``-n``, an option it never had."""
    with pytest.raises(ConfigError) as caught:
        checked_tasks(10, "2:4", 3, 1, "agentgym/Calculator-v0", num_tasks_name=name)
    assert str(caught.value) == f"give {tasks} START:END or {name} N, not both"
