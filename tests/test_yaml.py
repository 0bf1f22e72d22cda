"""`load_yaml`: configs mean what they look like, and errors are one line."""

from __future__ import annotations

import pytest

from agentgym import ConfigError
from agentgym._yaml import load_cli_value, load_yaml


def test_a_task_range_stays_a_string_not_a_base_60_number() -> None:
    # PyYAML reads 10:50 as 650 (YAML 1.1 base 60): train_tasks: 10:50 became task 650
    assert load_yaml("train_tasks: 10:50\neval_tasks: 1:51\nt: 1:30.5", "x") == {
        "train_tasks": "10:50", "eval_tasks": "1:51", "t": "1:30.5",
    }  # fmt: skip


def test_other_numbers_keep_their_yaml_types() -> None:
    text = "a: 12\nb: -3\nc: 1.5\nd: 0x1f\ne: 1_000\nf: .inf\ng: true\nh: null\ni: [1, 2.5]"
    assert load_yaml(text, "x") == {
        "a": 12, "b": -3, "c": 1.5, "d": 31, "e": 1000, "f": float("inf"), "g": True,
        "h": None, "i": [1, 2.5],
    }  # fmt: skip


def test_a_key_given_twice_is_refused_in_one_line() -> None:
    # PyYAML keeps the last value: a second learning_rate silently won
    with pytest.raises(ConfigError, match=r"^config 'a.yaml' is not valid YAML at line 3, "
                       r"column 1: the key 'learning_rate' appears twice$"):  # fmt: skip
        load_yaml("learning_rate: 1e-4\nlora_r: 8\nlearning_rate: 1e-3\n", "config 'a.yaml'")


def test_nested_mappings_are_checked_too() -> None:
    with pytest.raises(ConfigError, match="the key 'num_tasks' appears twice"):
        load_yaml("env_kwargs:\n  num_tasks: 1\n  num_tasks: 2\n", "x")


def test_a_date_stays_the_string_it_looks_like() -> None:
    # output_dir: 2024-01-01 was a date, refused as "(date) is not a valid str"
    assert load_yaml("output_dir: 2024-01-01\nb: 2024-01-01 10:00:00", "x") == {
        "output_dir": "2024-01-01", "b": "2024-01-01 10:00:00",
    }  # fmt: skip


def test_a_hash_in_a_command_line_value_is_kept_not_a_comment() -> None:
    # --set output_dir=runs/exp #2 trained into runs/exp; a system prompt lost its "#1"
    assert load_cli_value("runs/exp #2", "x") == "runs/exp #2"
    assert load_cli_value("Answer with the number #1", "x") == "Answer with the number #1"
    assert load_cli_value("[none, 'a #b']", "x") == ["none", "a #b"]
    assert load_cli_value("{k: v #1}", "x") == {"k": "v #1"}
    assert load_cli_value("5", "x") == 5 and load_cli_value("#", "x") == "#"
