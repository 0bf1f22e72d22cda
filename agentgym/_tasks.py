"""Tasks from anywhere: JSONL files, Python lists and local `datasets`, split reproducibly.

An env's tasks are a sequence of dicts (`ToolEnv(tasks=...)`, `rollout(tasks=[...])`);
`load_tasks` turns the places tasks live into that list, checking on the way that each task
is a JSON object (a trajectory records its task as JSON). `split_tasks` cuts a held-out split
that depends only on the tasks and the seed, not on their order, so the same eval set comes
back on every machine and an eval task never leaks into training. Nothing here downloads: a
`datasets` source must be a local folder (`save_to_disk`) or local data files.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias

from ._errors import ConfigError

if TYPE_CHECKING:
    import datasets

Split = Literal["train", "eval", "all"]
TaskSource: TypeAlias = (
    "str | os.PathLike[str] | Sequence[Mapping[str, Any]] | datasets.Dataset | datasets.DatasetDict"
)
"""A path (``.jsonl``, ``.json``, ``.csv``, ``.parquet``, a ``save_to_disk`` folder), a
sequence of mappings, or a `datasets.Dataset` / `DatasetDict`."""


def load_tasks(
    source: TaskSource, *, fields: Mapping[str, str] | None = None, hf_split: str = "train"
) -> list[dict[str, Any]]:
    """Read tasks as a list of dicts (JSON objects), in the source's order.

    Args:
        source: a ``.jsonl`` file (one JSON object a line; blank lines skipped), a ``.json``
            file holding a list of objects, a ``.csv`` file (a header row, then one task a
            row; every cell is the string it is in the file: ``"02139"`` stays ``"02139"``),
            a ``.parquet`` file (read with `datasets`, its columns keep their types), a folder
            written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``, a
            `datasets.Dataset`/`DatasetDict`, or a sequence of mappings.
        fields: renames, ``{column in the source: key in the task}`` (e.g.
            ``{"question": "prompt"}``); columns not named are kept as they are.
        hf_split: the split to read from a `DatasetDict` (a folder of several splits).

    Raises:
        ConfigError: a missing file, an unknown format, a row that is not a JSON object, a
            CSV row whose cells do not match its header, or a renamed column that no row has.
    """
    renames = dict(fields or {})
    tasks: list[dict[str, Any]] = []
    columns: set[str] = set()
    for where, row in _located(_read(source, hf_split), source):
        if not isinstance(row, Mapping):
            raise ConfigError(f"{where} is a {type(row).__name__}, not a JSON object (a dict)")
        columns.update(row)
        clash = sorted(
            k for k in renames if k in row and renames[k] in row and renames[k] not in renames
        )
        if clash:
            raise ConfigError(
                f"{where}: fields renames {clash} to {[renames[k] for k in clash]}, a column it "
                "already has; rename that column too, or drop it"
            )
        task: dict[str, Any] = {renames[k] if k in renames else k: v for k, v in row.items()}
        try:
            json.dumps(task, allow_nan=False)  # NaN: recorded trajectories would not be JSON
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where} is not JSON data ({exc}); convert that column") from exc
        tasks.append(task)
    absent = sorted(set(renames) - columns)
    if tasks and absent:
        raise ConfigError(
            f"fields renames column(s) {absent} that no task has; the tasks' columns are "
            f"{sorted(columns)}"
        )
    return tasks


class _Located(NamedTuple):
    """A row read from a file, with where it is (``'qa.jsonl' line 3``)."""

    where: str
    row: Any


def _located(rows: Iterable[Any], source: Any) -> Iterable[tuple[str, Any]]:
    """(where, row) pairs: a file's line when known, else the row's index (and the file)."""
    in_file = f" of {str(source)!r}" if isinstance(source, (str, os.PathLike)) else ""
    for i, row in enumerate(rows):
        if isinstance(row, _Located):
            yield row.where, row.row
        else:
            yield f"task {i}{in_file}", row


def _read(source: TaskSource, hf_split: str) -> Iterable[Any]:
    """The raw rows of ``source``."""
    if isinstance(source, (str, os.PathLike)):
        return _read_path(Path(source), hf_split)
    if _is_dataset_dict(source):
        return _pick_split(source, hf_split)
    if isinstance(source, Sequence) or _is_dataset(source):
        return source
    raise ConfigError(
        f"tasks must be a path, a list of dicts or a datasets.Dataset, got {type(source).__name__}"
    )


def _read_path(path: Path, hf_split: str) -> Iterable[Any]:
    if not path.exists():
        raise ConfigError(f"no task file or folder at {str(path)!r}")
    if path.is_dir():
        try:
            loaded = _datasets().load_from_disk(str(path))
        except FileNotFoundError as exc:
            raise ConfigError(
                f"{str(path)!r} is not a folder written by save_to_disk ({exc})"
            ) from exc
        return _pick_split(loaded, hf_split) if _is_dataset_dict(loaded) else loaded
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        lines = _text(path).split("\n")  # not splitlines: JSON strings may hold U+2028
        return [
            _Located(f"{str(path)!r} line {n}", _json_line(line, path, n))
            for n, line in enumerate(lines, 1)
            if line.strip()
        ]
    if suffix == ".json":
        try:
            rows = json.loads(_text(path))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{str(path)!r} line {exc.lineno} is not JSON: {exc.msg}") from exc
        if not isinstance(rows, list):
            raise ConfigError(f"{str(path)!r} must hold a JSON list of objects (or use .jsonl)")
        return rows
    if suffix == ".csv":
        return _read_csv(path)
    if suffix == ".parquet":
        return _datasets().Dataset.from_parquet(str(path))
    raise ConfigError(
        f"cannot read tasks from {str(path)!r}: use .jsonl, .json, .csv, .parquet or a "
        "save_to_disk folder"
    )


def _read_csv(path: Path) -> list[_Located]:
    """The rows of a CSV file as dicts of the header's names to each cell's text.

    CSV has no types, so none are guessed: a reader that infers them (pandas, `datasets`)
    turns an answer ``"42"`` into 42, which a reward comparing strings then fails on, and a
    ZIP code ``"02139"`` into 2139. Rows whose cells do not line up with the header are
    refused rather than padded or cut, for the same reason: nothing is made up or dropped.
    """
    with path.open(encoding="utf-8-sig", newline="") as f:  # -sig: Excel's byte-order mark
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header is None:
                return []
            _check_csv_header(header, path)
            return [
                _Located(f"{str(path)!r} line {reader.line_num}",
                         _csv_row(header, row, path, reader.line_num))
                for row in reader
                if row
            ]  # fmt: skip
        except UnicodeDecodeError as exc:
            raise _not_utf8(path, exc) from exc
        except csv.Error as exc:
            raise ConfigError(
                f"{str(path)!r} line {reader.line_num} is not valid CSV ({exc}); fix that line, "
                "or write the tasks as .jsonl"
            ) from exc


def _check_csv_header(header: list[str], path: Path) -> None:
    for sep, name in ((";", "semicolons"), ("\t", "tabs")):
        if len(header) == 1 and sep in header[0]:
            raise ConfigError(
                f"{str(path)!r} line 1 separates its columns with {name}, not commas; save it "
                "as comma-separated CSV (or write the tasks as .jsonl)"
            )
    twice = sorted(name for name, n in Counter(header).items() if n > 1)
    if twice:
        raise ConfigError(
            f"{str(path)!r} names column(s) {twice} more than once; give each column its own name"
        )


def _csv_row(header: list[str], row: list[str], path: Path, line: int) -> dict[str, str]:
    if len(row) != len(header):
        raise ConfigError(
            f"{str(path)!r} line {line} has {len(row)} cells but the header has {len(header)}; "
            'quote cells that contain commas ("a, b") and give every row every column'
        )
    return dict(zip(header, row, strict=True))


def _text(path: Path) -> str:
    """A UTF-8 file's text (a leading byte-order mark dropped, as Excel and Notepad write)."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc) from exc


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> ConfigError:
    with path.open("rb") as f:
        line = f.read(exc.start).count(b"\n") + 1 if exc.start >= 0 else "?"
    return ConfigError(
        f"{str(path)!r} line {line} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
        "save the file as UTF-8"
    )


def _json_line(line: str, path: Path, number: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{str(path)!r} line {number} is not JSON: {exc}") from exc


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(
            "reading this task source needs `datasets`: pip install datasets"
        ) from exc
    return datasets


def _is_dataset(value: Any) -> bool:
    return type(value).__name__ == "Dataset" and hasattr(value, "column_names")


def _is_dataset_dict(value: Any) -> bool:
    return type(value).__name__ in ("DatasetDict", "IterableDatasetDict")


def _pick_split(dataset_dict: Any, hf_split: str) -> Any:
    if hf_split not in dataset_dict:
        raise ConfigError(
            f"no split {hf_split!r} in the dataset; pass hf_split= one of {sorted(dataset_dict)} "
            "to load_tasks (for an env's tasks=, pass it the list load_tasks returns)"
        )
    return dataset_dict[hf_split]


class TaskSplits(NamedTuple):
    """A training split and a held-out split, each in the source's order."""

    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]


def split_tasks(
    tasks: Sequence[Mapping[str, Any]],
    eval_fraction: float = 0.1,
    seed: int = 0,
    *,
    key: str | Callable[[Mapping[str, Any]], Hashable] | None = None,
) -> TaskSplits:
    """Cut ``tasks`` into train and eval, the same way for the same tasks and seed.

    Each group of tasks (by ``key``) gets a rank from a hash of the seed and the group; the
    ``round(groups * eval_fraction)`` lowest ranks are held out (at least one group and at
    most all but one, when there are two or more groups and ``eval_fraction > 0``). So the
    split does not depend on the tasks' order, and the same seed gives the same split
    everywhere.

    Args:
        tasks: the tasks (dicts of JSON data).
        eval_fraction: share of groups held out, in [0, 1).
        seed: which split; another seed gives another held-out set.
        key: what keeps tasks together, a task key (e.g. ``"doc_id"``: questions about one
            document are all train or all eval) or a function of the task; None: the whole
            task, so identical tasks stay together.
    """
    if (
        isinstance(eval_fraction, bool)
        or not isinstance(eval_fraction, (int, float))
        or not 0 <= eval_fraction < 1
    ):
        raise ConfigError(f"eval_fraction must be a number in [0, 1), got {eval_fraction!r}")
    tasks = list(tasks)  # a generator would be read up by the grouping
    if isinstance(key, str) and tasks and not any(key in t for t in tasks):
        raise ConfigError(
            f"split key {key!r} is in no task; the tasks' keys are "
            f"{sorted({k for t in tasks for k in t})}"
        )
    group_of = _group_function(key)
    groups = [json.dumps(group_of(t), sort_keys=True, default=str) for t in tasks]
    unique = sorted(set(groups), key=lambda g: hashlib.sha256(f"{seed}\0{g}".encode()).digest())
    count = round(len(unique) * eval_fraction)
    if eval_fraction > 0 and len(unique) >= 2:
        count = min(max(count, 1), len(unique) - 1)
    held_out = set(unique[:count])
    train: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    for task, group in zip(tasks, groups, strict=True):
        (held if group in held_out else train).append(dict(task))
    return TaskSplits(train, held)


def _group_function(
    key: str | Callable[[Mapping[str, Any]], Hashable] | None,
) -> Callable[[Mapping[str, Any]], Any]:
    if key is None:
        return lambda task: task
    if isinstance(key, str):
        return lambda task: task.get(key, task)
    return key


def select_split(
    tasks: Sequence[Mapping[str, Any]],
    split: Split,
    eval_fraction: float = 0.1,
    seed: int = 0,
    *,
    key: str | Callable[[Mapping[str, Any]], Hashable] | None = None,
) -> list[dict[str, Any]]:
    """The ``split`` of `split_tasks` (``"all"``: every task, in order): an env's ``split=``."""
    if split not in ("train", "eval", "all"):
        raise ConfigError(f"split must be 'train', 'eval' or 'all', got {split!r}")
    if split == "all":
        return [dict(t) for t in tasks]
    splits = split_tasks(tasks, eval_fraction, seed, key=key)
    return splits.train if split == "train" else splits.eval


def tasks_digest(tasks: Sequence[Any], indices: Iterable[int]) -> str:
    """A short hash of the tasks at ``indices``, in order: which tasks a run plays.

    Why: a resumed run is checked against its settings, but the tasks behind an env's options
    can change under it (a new version of the env, of its data, of a generated task list);
    resumed, the run would mix the old tasks with the new. Its record keeps this digest, and
    a resume compares it.
    """
    sha = hashlib.sha256()
    for i in indices:
        sha.update(task_text(tasks[i]).encode("utf-8", "surrogatepass") + b"\n")
    return sha.hexdigest()[:16]


def task_text(task: Any) -> str:
    """A task as canonical JSON text (keys sorted), to compare and hash tasks by value."""
    try:
        return json.dumps(task, sort_keys=True, default=str)
    except TypeError:  # keys of mixed types cannot be sorted
        return repr(task)


#: The end of the largest task range taken (a list of its indices is 80 MB).
MAX_TASKS = 10_000_000


def check_num_tasks(num_tasks: int | None, *, none_ok: bool) -> None:
    """Refuse an env's ``num_tasks`` that would give it no tasks, or that is not a count.

    Why: ``--env-arg num_tasks=-5`` made an env of no tasks (``range`` and slicing take it),
    which a run then reported far from the option that caused it.
    ``none_ok``: the env reads None as "all of them".
    """
    if num_tasks is None and none_ok:
        return
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
        also = " or None (all)" if none_ok else ""
        raise ConfigError(f"num_tasks must be an int >= 1{also}, got {num_tasks!r}")
    if num_tasks is not None and num_tasks > MAX_TASKS:  # a generated list that size: all memory
        raise ConfigError(f"num_tasks {num_tasks:,} is more than agentgym plays ({MAX_TASKS:,})")


def tasks_of_env(spec: str, env_id: str, count: int) -> list[int]:
    """``--tasks`` indices (`parse_tasks`), refused in one line when they reach past the env's.

    One check for ``agentgym sft`` and for a queued sft job, so the job is refused at
    submission with the words the command would use, not when its worker starts.
    """
    indices = parse_tasks(spec, "--tasks")
    if max(indices) >= count:
        raise ConfigError(
            f"--tasks {spec} reaches task {max(indices)} but {env_id!r} has {count} tasks "
            f"(0:{count}); pick a range inside it, or give the env more with --env-arg"
        )
    return indices


def parse_tasks(spec: str | list[int], name: str = "tasks") -> list[int]:
    """Task indices from ``"start:stop"`` (half-open, like ``range``) or an explicit list.

    Raises:
        ConfigError: malformed, empty, negative or duplicated indices.
    """
    if isinstance(spec, str):
        return _range_indices(spec, name)
    indices = [int(i) for i in spec]
    if not indices or min(indices) < 0 or len(set(indices)) != len(indices):
        raise ConfigError(
            f"{name}={spec!r} must hold at least one task index, all >= 0 and distinct; "
            "fix the list or use a 'start:stop' range"
        )
    return indices


def _range_indices(spec: str, name: str) -> list[int]:
    """The indices of a ``"start:stop"`` range, refused in words that fit what was written.

    Why: ``--tasks -3:2`` was told to "fix the list" of a user who wrote a range, not a list.
    A negative bound is no count from the end (``range`` would make it one), and a reversed or
    equal pair is an empty range; each is named, with a range that would play.
    """
    start_text, sep, stop_text = spec.partition(":")
    start, stop = _bound(start_text), _bound(stop_text)
    if max(start or 0, stop or 0) > MAX_TASKS:  # before a fix is offered: it would reach past
        raise ConfigError(  # listed, 0:3000000000 took all memory
            f"{name}={spec!r} reaches past task {MAX_TASKS:,}, the most agentgym plays; "
            "pick a range inside the env's tasks"
        )
    if start is None or stop is None:  # "7" too: its stop is ""
        missing = sep and not (start_text.strip() and stop_text.strip())
        problem = "leaves out a bound: give both of" if missing else "is not"
        raise ConfigError(
            f"{name}={spec!r} {problem} a non-empty 'start:stop' range of task indices; "
            f"write e.g. {_whole_range(start, stop)}"
            + ("" if name.startswith("--") else " or a list of indices")
        )
    if min(start, stop) < 0:
        first = max(start, 0)
        raise ConfigError(
            f"{name}={spec!r} has a negative bound, but task indices start at 0 (none counts "
            f"from the end); write e.g. '{first}:{max(stop, first + 1)}'"
        )
    if stop <= start:
        fix = f"'{start}:{start + 1}' for task {start}" if stop == start else f"'{stop}:{start}'"
        raise ConfigError(
            f"{name}={spec!r} is an empty range: 'start:stop' is half-open, stop past start; "
            f"write e.g. {fix}"
        )
    return list(range(start, stop))


def _bound(text: str) -> int | None:
    """One bound of a range; None where it is left out or no integer."""
    try:
        return int(text)
    except ValueError:
        return None


def _whole_range(start: int | None, stop: int | None) -> str:
    """A range that plays what a spec with a bound left out most likely meant.

    ``'7'`` (or ``'7:'``) is task 7 alone, ``':5'`` the tasks before 5: the start is 0.
    """
    if start is not None and start >= 0:
        return f"'{start}:{start + 1}' for task {start}"
    if start is None and stop is not None and stop > 0:
        return f"'0:{stop}'"
    return "'100:600'"
