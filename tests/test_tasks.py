"""Tasks from anywhere: `load_tasks` over files, lists and local datasets; `split_tasks`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import agentgym
from agentgym import ConfigError
from agentgym._tasks import load_tasks, select_split, split_tasks
from tests.conftest import require

ROWS = [{"q": f"What is {i} + {i}?", "a": str(2 * i)} for i in range(20)]
FIELDS = {"q": "prompt", "a": "answer"}


def test_jsonl_json_and_lists_load_alike(tmp_path: Path):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in ROWS[:3]) + "\n\n")  # a blank line
    as_json = tmp_path / "t.json"
    as_json.write_text(json.dumps(ROWS[:3]))
    expected = [{"prompt": r["q"], "answer": r["a"]} for r in ROWS[:3]]
    assert load_tasks(jsonl, fields=FIELDS) == expected
    assert load_tasks(str(as_json), fields=FIELDS) == expected
    assert load_tasks(ROWS[:3], fields=FIELDS) == expected
    assert load_tasks(ROWS[:1]) == [ROWS[0]] and load_tasks(ROWS[:1])[0] is not ROWS[0]


def test_local_hf_datasets_load_from_files_folders_and_objects(tmp_path: Path):
    datasets = require("datasets")
    dataset = datasets.Dataset.from_list(ROWS[:4])
    dataset.to_csv(str(tmp_path / "t.csv"))
    dataset.to_parquet(str(tmp_path / "t.parquet"))
    dataset.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": dataset, "test": dataset.select([0])}).save_to_disk(
        str(tmp_path / "two")
    )
    expected = load_tasks(ROWS[:4], fields=FIELDS)
    for source in ("t.parquet", "one", "two"):
        assert load_tasks(tmp_path / source, fields=FIELDS) == expected, source
    from_csv = load_tasks(tmp_path / "t.csv", fields=FIELDS)
    assert from_csv == expected  # CSV has no types: cells stay the strings in the file
    assert load_tasks(tmp_path / "two", fields=FIELDS, hf_split="test") == expected[:1]
    assert load_tasks(dataset, fields=FIELDS) == expected
    with pytest.raises(ConfigError, match=r"hf_split= one of \['test', 'train'\]"):
        load_tasks(tmp_path / "two", hf_split="validation")
    with pytest.raises(ConfigError, match="not a folder written by save_to_disk"):
        load_tasks(tmp_path)


def test_bad_sources_are_config_errors_naming_the_fix(tmp_path: Path):
    with pytest.raises(ConfigError, match="no task file"):
        load_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ConfigError, match="use .jsonl"):
        load_tasks(tmp_path / "t.txt")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{oops\n')
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        load_tasks(tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match="task 1 is a str"):
        load_tasks([{"prompt": "x"}, "y"])
    with pytest.raises(ConfigError, match="task 0 is not JSON data"):
        load_tasks([{"prompt": {1, 2}}])
    # Python's json reads NaN, but a trajectory recording it would not be JSON any more
    (tmp_path / "nan.jsonl").write_text('{"prompt": "x", "answer": NaN}\n')
    with pytest.raises(ConfigError, match="nan.jsonl' line 1 is not JSON data"):
        load_tasks(tmp_path / "nan.jsonl")
    with pytest.raises(ConfigError, match=r"column\(s\) \['question'\]"):
        load_tasks(ROWS, fields={"question": "prompt"})
    with pytest.raises(ConfigError, match="a path, a list of dicts"):
        load_tasks(42)


def test_split_is_exact_disjoint_and_independent_of_order():
    tasks = load_tasks(ROWS, fields=FIELDS)
    train, held = split_tasks(tasks, eval_fraction=0.25, seed=3)
    assert len(held) == 5 and len(train) == 15
    assert sorted(map(json.dumps, train + held)) == sorted(map(json.dumps, tasks))
    shuffled = tasks[:]
    random.Random(0).shuffle(shuffled)
    assert sorted(map(json.dumps, split_tasks(shuffled, 0.25, 3).eval)) == sorted(
        map(json.dumps, held)
    )
    assert split_tasks(tasks, 0.25, 4).eval != held
    assert [t for t in tasks if t in train] == train  # each split keeps the source's order


def test_split_keeps_groups_together():
    tasks = [{"prompt": f"q{i}", "doc": i // 3} for i in range(30)]  # 10 docs, 3 questions each
    train, held = split_tasks(tasks, 0.2, seed=0, key="doc")
    assert len(held) == 6 and not {t["doc"] for t in train} & {t["doc"] for t in held}
    duplicates = [{"prompt": "same"}] * 3 + [{"prompt": "other"}]
    train, held = split_tasks(duplicates, 0.5)
    assert len(held) in (1, 3) and (held[0] not in train)  # identical tasks never straddle
    by_function = split_tasks(tasks, 0.2, seed=0, key=lambda t: t["doc"])
    assert by_function.eval == split_tasks(tasks, 0.2, seed=0, key="doc").eval


def test_split_edge_cases_and_select():
    one = [{"prompt": "only"}]
    assert split_tasks(one, 0.5) == ([{"prompt": "only"}], [])
    assert len(split_tasks(ROWS, 0.01).eval) == 1  # a positive fraction holds out at least one
    assert split_tasks(ROWS, 0.0).eval == []
    with pytest.raises(ConfigError, match=r"in \[0, 1\)"):
        split_tasks(ROWS, 1.0)
    assert select_split(ROWS, "all") == ROWS
    assert select_split(ROWS, "eval", 0.1, 7) == split_tasks(ROWS, 0.1, 7).eval
    with pytest.raises(ConfigError, match="split must be"):
        select_split(ROWS, "test")  # type: ignore[arg-type]


def test_loaded_tasks_feed_tool_env_and_rollout(tmp_path: Path):
    path = tmp_path / "calc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:4]))
    tasks = load_tasks(path, fields=FIELDS)
    env = agentgym.ToolEnv([], tasks=tasks, max_turns=1)
    obs, info = env.reset(seed=0)
    assert obs[-1]["content"] in {t["prompt"] for t in tasks} and info["task"] in tasks
    policy = agentgym.ScriptedPolicy(lambda task: [task["answer"]])
    trajectories = agentgym.rollout("calculator", policy, tasks=tasks)
    assert [t.final_reward for t in trajectories] == [1.0] * 4
    assert [t.task for t in trajectories] == tasks
