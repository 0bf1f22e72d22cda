"""`load_tasks` keeps each format's types: CSV cells stay strings, JSONL/Parquet keep theirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentgym
from agentgym import ConfigError, Rubric, ToolEnv
from tests.conftest import require

#: Cells a type-guessing reader changes: numbers, a ZIP code, NA markers, spaces, a boolean.
CSV_TEXT = (
    "prompt,answer,zip,empty,na,padded,flag\n"
    'What is 6 * 7?,42,02139,,NA," 7 ",true\n'
    '"A cell over\ntwo lines, with a comma",1.50,00501,x,null,-0,False\n'
)


def correct(completion: str, answer: str) -> float:
    """The README's reward: it needs ``answer`` to be a str."""
    return float(answer in completion)


def test_csv_cells_stay_the_strings_they_are_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tasks.csv"
    path.write_bytes(b"\xef\xbb\xbf" + CSV_TEXT.encode())  # with Excel's byte-order mark
    tasks = agentgym.load_tasks(path)
    assert tasks == [
        {"prompt": "What is 6 * 7?", "answer": "42", "zip": "02139", "empty": "",
         "na": "NA", "padded": " 7 ", "flag": "true"},
        {"prompt": "A cell over\ntwo lines, with a comma", "answer": "1.50", "zip": "00501",
         "empty": "x", "na": "null", "padded": "-0", "flag": "False"},
    ]  # fmt: skip
    renamed = agentgym.load_tasks(str(path), fields={"zip": "postcode"})
    assert renamed[0]["postcode"] == "02139" and "zip" not in renamed[0]


def test_a_csv_answer_scores_with_the_readme_reward(tmp_path: Path) -> None:
    path = tmp_path / "tasks.csv"
    path.write_text(CSV_TEXT)
    env = ToolEnv(tasks=agentgym.load_tasks(path), rubric=Rubric([correct]))
    env.reset(options={"task": 0})
    _, reward, terminated, _, info = env.step("6 * 7 is 42.")
    assert terminated and info["reward_errors"] == {}  # was TypeError: 'in <string>' ... int
    assert reward == 1.0 and info["scores"] == {"correct": 1.0}


def test_jsonl_and_parquet_keep_their_own_types(tmp_path: Path) -> None:
    rows = [{"prompt": "p", "answer": 42, "zip": "02139", "ok": True, "score": 0.5}]
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(json.dumps(rows[0]) + "\n")
    assert agentgym.load_tasks(jsonl) == rows
    datasets = require("datasets")
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "t.parquet"))
    from_parquet = agentgym.load_tasks(tmp_path / "t.parquet")
    assert from_parquet == rows and type(from_parquet[0]["answer"]) is int


def test_a_csv_with_only_a_header_or_nothing_has_no_tasks(tmp_path: Path) -> None:
    (tmp_path / "header.csv").write_text("prompt,answer\n")
    (tmp_path / "empty.csv").write_text("")
    assert agentgym.load_tasks(tmp_path / "header.csv") == []
    assert agentgym.load_tasks(tmp_path / "empty.csv") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prompt,answer\nWhat is 1, 2?,3\n", r"line 2 has 3 cells but the header has 2; quote"),
        ("prompt,answer\nonly a prompt\n", r"line 2 has 1 cells but the header has 2"),
        ("prompt,answer,prompt\na,b,c\n", r"names column\(s\) \['prompt'\] more than once"),
    ],
    ids=["extra-cell", "missing-cell", "duplicate-column"],
)
def test_csv_rows_that_do_not_fit_the_header_are_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as excinfo:
        agentgym.load_tasks(path)
    assert "bad.csv" in str(excinfo.value) and "\n" not in str(excinfo.value)
