"""A user's own data through load_tasks / split_tasks, the Search env and the PythonCode env.

Each test is a mistake a user makes with real files; the error must be a one-line
`ConfigError` naming the fix (and the file and line where a row is at fault), never a
traceback from deep inside, nor a setting silently ignored.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import agentgym
from agentgym import ConfigError, load_tasks, split_tasks

pytest.importorskip("bm25s")


def _jsonl(path: Path, rows: list[object], encoding: str = "utf-8") -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding)
    return path


def test_jsonl_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}], "utf-8-sig")
    assert load_tasks(path) == [{"question": "q", "answer": "a"}]


def test_a_non_object_jsonl_row_names_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text('{"a": 1}\n\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"qa\.jsonl' line 3 is a list"):
        load_tasks(path)


def test_a_jsonl_string_holding_a_line_separator_stays_one_row(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "qa.jsonl", [{"question": "a\u2028b", "answer": "x"}])
    assert load_tasks(path) == [{"question": "a\u2028b", "answer": "x"}]


def test_a_broken_json_file_is_a_config_error_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "qa.json"
    path.write_text('[{"a": 1},\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"qa\.json' line \d+ is not JSON"):
        load_tasks(path)


@pytest.mark.parametrize("name", ["qa.jsonl", "qa.csv"])
def test_a_file_not_in_utf8_is_a_config_error_with_its_line(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    body = '{"q": "caf\xe9"}\n' if name.endswith("jsonl") else "q,a\nok,1\ncaf\xe9,x\n"
    path.write_bytes(body.encode("latin-1"))
    line = 1 if name.endswith("jsonl") else 3
    with pytest.raises(ConfigError, match=rf"line {line} is not UTF-8.*save the file as UTF-8"):
        load_tasks(path)


def test_a_semicolon_csv_is_refused_not_read_as_one_column(tmp_path: Path) -> None:
    path = tmp_path / "qa.csv"
    path.write_text("question;answer\nWho?;Ann\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="semicolons"):
        load_tasks(path)


def test_a_rename_onto_an_existing_column_is_refused(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "qa.jsonl", [{"q": "new", "question": "old", "answer": "a"}])
    with pytest.raises(ConfigError, match=r"qa\.jsonl' line 1: fields renames \['q'\]"):
        load_tasks(path, fields={"q": "question"})
    swapped = load_tasks(path, fields={"q": "question", "question": "q"})  # a swap is fine
    assert swapped == [{"question": "new", "q": "old", "answer": "a"}]


def test_a_missing_split_of_a_datasets_folder_says_how_an_env_gets_it(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [{"question": "q", "answer": "a"}]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(tmp_path / "d")
    with pytest.raises(ConfigError, match="to load_tasks"):
        load_tasks(tmp_path / "d")
    assert load_tasks(tmp_path / "d", hf_split="test") == rows


def test_split_tasks_refuses_a_key_no_task_has() -> None:
    tasks = [{"question": str(i), "doc_id": str(i % 3)} for i in range(12)]
    with pytest.raises(ConfigError, match="'docid' is in no task"):
        split_tasks(tasks, 0.3, key="docid")
    by_doc = split_tasks(tasks, 0.3, key="doc_id")
    train_docs = {t["doc_id"] for t in by_doc.train}
    assert by_doc.eval and not train_docs & {t["doc_id"] for t in by_doc.eval}


@pytest.mark.parametrize("fraction", ["0.2", None, True])
def test_split_tasks_refuses_a_fraction_that_is_no_number(fraction: object) -> None:
    with pytest.raises(ConfigError, match="eval_fraction must be a number"):
        split_tasks([{"a": 1}, {"a": 2}], fraction)  # type: ignore[arg-type]


def test_split_tasks_reads_a_generator_like_its_list() -> None:
    tasks = [{"n": i} for i in range(20)]
    assert split_tasks(iter(tasks), 0.25, seed=4) == split_tasks(tasks, 0.25, seed=4)  # type: ignore[arg-type]


def _corpus(tmp_path: Path) -> Path:
    rows = [{"id": f"d{i}", "title": f"Town {i}", "text": f"Mayor{i} runs café town {i}"}
            for i in range(6)]  # fmt: skip
    return _jsonl(tmp_path / "corpus.jsonl", rows)


def test_search_corpus_without_indexable_words_is_a_config_error(tmp_path: Path) -> None:
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}, {"id": "b", "text": ""}])
    with pytest.raises(ConfigError, match="no word to index"):
        agentgym.make("search", corpus=corpus, tasks=[{"question": "q", "answer": "a"}])


def test_search_title_column_typo_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'ttl' as the title column"):
        agentgym.make("search", corpus=_corpus(tmp_path), fields={"title": "ttl"},
                      tasks=[{"question": "q", "answer": "a"}])  # fmt: skip


def test_search_duplicate_ids_are_named(tmp_path: Path) -> None:
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": "dup7", "text": "one doc"},
                                           {"id": "dup7", "text": "two doc"}])  # fmt: skip
    with pytest.raises(ConfigError, match="dup7"):
        agentgym.make("search", corpus=corpus, tasks=[{"question": "q", "answer": "a"}])


def test_search_numeric_answer_error_names_the_value_not_the_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'answer' must be a string.*got 42"):
        agentgym.make("search", corpus=_corpus(tmp_path), tasks=[{"question": "q", "answer": 42}])


def test_search_empty_split_is_refused(tmp_path: Path) -> None:
    tasks = [{"question": f"Who runs town {i}?", "answer": f"Mayor{i}"} for i in range(4)]
    with pytest.raises(ConfigError, match="leaves no question"):
        agentgym.make("search", corpus=_corpus(tmp_path), tasks=tasks, split="eval",
                      eval_fraction=0)  # fmt: skip


def test_search_own_csv_tasks_play_to_reward_one(tmp_path: Path) -> None:
    qa = tmp_path / "qa.csv"
    qa.write_text(
        "\ufeffquestion,answer,doc_id\n"
        + "".join(f'"Who runs café town {i}, ünï?",Mayor{i},d{i}\n' for i in range(6)),
        encoding="utf-8",
    )
    kwargs = {"corpus": str(_corpus(tmp_path)), "tasks": str(qa), "split": "all"}
    env = agentgym.make("search", **kwargs)
    policy = agentgym.ScriptedPolicy(env.reference_turns)
    done = agentgym.rollout("search", policy, env_kwargs=kwargs)
    assert [t.final_reward for t in done] == [1.0] * 6
    wrong = agentgym.rollout("search", agentgym.ScriptedPolicy(["Answer: Mayor9"]),
                             num_tasks=2, env_kwargs=kwargs)  # fmt: skip
    assert [t.final_reward for t in wrong] == [0.0, 0.0]


def test_pythoncode_csv_tasks_with_json_tests_play(tmp_path: Path) -> None:
    path = tmp_path / "code.csv"
    path.write_text('prompt,tests,solution\n"Write f()","[""assert f() == 1""]",'
                    '"def f():\n    return 1"\n', encoding="utf-8")  # fmt: skip
    kwargs = {"tasks": str(path), "backend": "local"}
    with warnings.catch_warnings():  # LocalSandbox's once-per-process "not a boundary" warning
        warnings.simplefilter("ignore", UserWarning)
        env = agentgym.make("pythoncode", **kwargs)
        assert env.tasks[0]["tests"] == ["assert f() == 1"]
        done = agentgym.rollout("pythoncode", agentgym.ScriptedPolicy(env.reference_turns),
                                env_kwargs=kwargs)  # fmt: skip
    assert [t.final_reward for t in done] == [1.0]


def test_pythoncode_tests_as_a_plain_string_says_write_a_list(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "code.jsonl", [{"prompt": "p", "tests": "assert f() == 1"}])
    with pytest.raises(ConfigError, match=r"'tests' must be a non-empty list.*JSON text"):
        agentgym.make("pythoncode", tasks=path, backend="local")
