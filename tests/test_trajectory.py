"""`Trajectory`: lossless JSONL round trip, atomic writes, and the flattened training sequence."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentgym import (
    Completion,
    ConfigError,
    PrefixMismatchError,
    Trajectory,
    Turn,
    read_jsonl,
    recover_jsonl,
    write_jsonl,
)


def rich_trajectory() -> Trajectory:
    return Trajectory(
        env_id="agentgym/Calculator-v0",
        task={"prompt": 'Ünïcödé ✓ 🚀 "quotes"\n\ttabs', "meta": {"tags": ["a", None], "n": 0.1}},
        task_index=3,
        task_position=2,
        group_index=1,
        seed=42,
        messages=[
            {"role": "user", "content": "日本語"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {}}]},
        ],
        turns=[
            Turn(
                prompt_ids=[1, 2, 3],
                completion_ids=[4, 5],
                logprobs=[-0.1, -1e-300],
                completion_mask=[1, 1],
                text="<tool_call>\n{}\n</tool_call>",
                finish_reason="stop",
                reward=0.1,
                tool_errors=["unknown tool 'x'"],
                policy_seconds=1e-300,
                env_seconds=0.30000000000000004,
            ),
            Turn(),  # every optional field None
        ],
        final_reward=None,
        scores={"correct": 1.0, "broken": None, "tiny": 5e-324},
        status="error",
        error="Traceback (most recent call last):\n  ...\nRuntimeError: ✗",
        timings={"total": 1.5e308, "policy": 0.1},
        info={"nested": {"deep": [1, {"x": [None, True, False]}]}},
    )


def test_jsonl_round_trip_is_lossless(tmp_path: Path) -> None:
    originals = [rich_trajectory(), Trajectory(env_id="plain")]
    path = tmp_path / "t.jsonl"
    assert write_jsonl(originals, path) == 2
    restored = list(read_jsonl(path))
    assert [t.to_dict() for t in restored] == [t.to_dict() for t in originals]
    assert restored == originals
    assert all(isinstance(turn, Turn) for turn in restored[0].turns)
    assert restored[0].turns[0].logprobs[1] == -1e-300
    assert restored[0].scores["tiny"] == 5e-324


def test_jsonl_is_one_utf8_line_per_trajectory(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_jsonl(iter([rich_trajectory()] * 3), path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3
    assert "🚀" in lines[0]  # written as UTF-8, not \u escapes


def test_read_jsonl_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_jsonl([Trajectory(env_id="a")], path)
    path.write_text(path.read_text() + "\n\n")
    assert [t.env_id for t in read_jsonl(path)] == ["a"]


def _explodes_after_one() -> Iterator[Trajectory]:
    yield rich_trajectory()
    raise RuntimeError("generator broke")


def test_write_jsonl_is_atomic_for_new_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with pytest.raises(RuntimeError, match="generator broke"):
        write_jsonl(_explodes_after_one(), path)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == [], "no partial or temporary file is left behind"


def test_write_jsonl_makes_missing_folders(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "eval.jsonl"  # the README's path in a fresh checkout
    assert write_jsonl([Trajectory(env_id="a")], path) == 1
    assert [t.env_id for t in read_jsonl(path)] == ["a"]


def test_write_jsonl_keeps_previous_content_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_jsonl([Trajectory(env_id="old")], path)
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        write_jsonl(_explodes_after_one(), path)
    assert path.read_bytes() == before


def test_step_rewards_and_total() -> None:
    t = Trajectory(env_id="x", turns=[Turn(reward=0.25), Turn(reward=0.5)], final_reward=1.0)
    assert t.step_rewards == [0.25, 0.5]
    assert t.total_reward == 1.75
    assert Trajectory(env_id="x", turns=[Turn(reward=0.5)]).total_reward == 0.5


def test_flatten_masks_env_tokens() -> None:
    t = Trajectory(
        env_id="x",
        turns=[
            Turn(prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, -0.2]),
            # prompt extends: env/tool tokens 5, 6 were appended after the completion
            Turn(prompt_ids=[1, 2, 3, 4, 5, 6], completion_ids=[7], logprobs=[-0.3],
                 completion_mask=[1]),
        ],
    )  # fmt: skip
    ids, mask, logprobs = t.flatten()
    assert ids == [1, 2, 3, 4, 5, 6, 7]
    assert mask == [0, 0, 1, 1, 0, 0, 1]
    assert logprobs == [None, None, -0.1, -0.2, None, None, -0.3]


def test_flatten_respects_completion_mask_and_missing_logprobs() -> None:
    t = Trajectory(
        env_id="x", turns=[Turn(prompt_ids=[9], completion_ids=[1, 2], completion_mask=[1, 0])]
    )
    assert t.flatten() == ([9, 1, 2], [0, 1, 0], [None, None, None])


def test_flatten_rejects_rewritten_history() -> None:
    t = Trajectory(
        env_id="x",
        turns=[
            Turn(prompt_ids=[1, 2], completion_ids=[3, 4]),
            Turn(prompt_ids=[1, 2, 99, 5], completion_ids=[6]),  # template dropped token 3
        ],
    )
    with pytest.raises(PrefixMismatchError, match="turn 1"):
        t.flatten()


def test_flatten_rejects_shorter_later_prompt() -> None:
    t = Trajectory(
        env_id="x",
        turns=[
            Turn(prompt_ids=[1, 2], completion_ids=[3]),
            Turn(prompt_ids=[1], completion_ids=[4]),
        ],
    )
    with pytest.raises(PrefixMismatchError):
        t.flatten()


def test_flatten_needs_token_ids() -> None:
    t = Trajectory(env_id="x", turns=[Turn(text="no ids")])
    with pytest.raises(ValueError, match="no token ids"):
        t.flatten()


def test_recover_jsonl_drops_a_torn_last_line_and_truncates(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_jsonl([Trajectory(env_id="a"), Trajectory(env_id="b")], path)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"env_id": "c", "mess')
    recovered = recover_jsonl(path)
    assert [t.env_id for t in recovered] == ["a", "b"]
    assert path.read_bytes() == whole  # appending can continue on a clean line boundary


def test_key_is_task_position_and_group_index() -> None:
    assert rich_trajectory().key == (2, 1)
    assert Trajectory(env_id="old file").key == (None, 0)


def test_turn_from_completion_marks_every_token_sampled() -> None:
    completion = Completion(
        text="hi", prompt_ids=[1], completion_ids=[2, 3], logprobs=[-0.5, -0.25],
        finish_reason="length",
    )  # fmt: skip
    turn = Turn.from_completion(completion, reward=0.5)
    assert turn == Turn(
        prompt_ids=[1], completion_ids=[2, 3], logprobs=[-0.5, -0.25], completion_mask=[1, 1],
        text="hi", finish_reason="length", reward=0.5,
    )  # fmt: skip
    assert Turn.from_completion(Completion(text="raw")).completion_mask is None


def test_a_record_from_a_newer_version_reads_and_a_task_file_is_refused(tmp_path) -> None:
    from agentgym import ConfigError, read_jsonl

    record = Trajectory(env_id="e", turns=[Turn(text="hi")]).to_dict()
    record["added_later"] = 1
    record["turns"][0]["also_later"] = 2
    newer = tmp_path / "newer.jsonl"
    newer.write_text(json.dumps(record) + "\n")
    [trajectory] = read_jsonl(newer)
    assert trajectory.env_id == "e" and trajectory.turns[0].text == "hi"

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "2+2?", "answer": "4"}) + "\n")
    with pytest.raises(ConfigError, match=r"not a trajectory record .*agentgym.load_tasks"):
        list(read_jsonl(tasks))


def test_read_jsonl_names_the_file_and_line_that_is_not_a_trajectory(tmp_path) -> None:
    """A bare JSON traceback named neither; each reader re-read the file to find the line."""
    from agentgym._trajectory import TrajectoryLineError

    path = tmp_path / "t.jsonl"
    write_jsonl([Trajectory(env_id="calculator")], path)
    with path.open("a") as f:
        f.write("\n" + '{"env_id": "calculator", \n')
    with pytest.raises(TrajectoryLineError, match=rf"line 3 of {re.escape(str(path))} is not a "
                       r"trajectory \(not JSON") as info:  # fmt: skip
        list(read_jsonl(path))
    assert info.value.line == 3 and isinstance(info.value, ConfigError)
