"""Recorded episodes as SFT data: which to keep, in what order, and how they were played.

`agentgym sft --trajectories` (`trainers._sft_cli`) reads an eval's ``trajectories.jsonl``
files here: each line a `Trajectory`, kept when it ended ``ok`` with enough reward, sorted by
task so a recording's finishing order never sets the training order, with the env options
and chat-template variables the eval's ``run.json`` says they were played with.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym._cli_common import parse_env_args
from agentgym._errors import ConfigError
from agentgym._registry import resolve_id
from agentgym._trajectory import Trajectory, TrajectoryLineError, trajectories_of_lines

from ._sft import Message


def played_settings(paths: Sequence[Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The env options and chat-template variables the episodes were played with.

    Read from the ``run.json`` an eval writes beside its ``trajectories.jsonl``; files without
    one add nothing. Why: the episodes carry their system prompt and turn limit, and a model
    trained on them is evaluated, and trained on, under the same settings; the defaults would
    render other tools' text or another template.

    Raises:
        ConfigError: two files were played with different settings.
    """
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for path in paths:
        record = path.parent / "run.json"
        if record.is_file():
            run = json.loads(record.read_text(encoding="utf-8"))
            found[str(path)] = (run.get("env_kwargs") or {}, run.get("chat_template_kwargs") or {})
    if len({json.dumps(v, sort_keys=True) for v in found.values()}) > 1:
        raise ConfigError(
            f"the trajectories were played with different env options or chat-template "
            f"variables ({found}); give files of one setting, or set them with --env-arg and "
            "--chat-template-kwargs"
        )
    return next(iter(found.values()), ({}, {}))


def eval_options(source: Mapping[str, Any]) -> list[str]:
    """The `agentgym eval` options that play the env as an SFT source was played.

    ``source`` is ``sft.json``'s: its ``env_kwargs`` and ``chat_template_kwargs``.
    """
    options: list[str] = []
    for key, value in (source.get("env_kwargs") or {}).items():
        options += ["--env-arg", f"{key}={_as_env_arg(value)}"]
    if template := source.get("chat_template_kwargs"):
        options += ["--chat-template-kwargs", json.dumps(template)]
    return options


def _as_env_arg(value: Any) -> str:
    """``value`` as ``--env-arg`` reads it back: a plain string as is, else JSON ("3" too)."""
    plain = isinstance(value, str) and parse_env_args([f"k={value}"])["k"] == value
    return str(value) if plain else json.dumps(value)


def kept_conversations(
    paths: Sequence[Path], min_reward: float | None, hold_out: int = 0
) -> tuple[list[list[Message]], list[list[Message]], dict[str, Any]]:
    """The kept episodes' messages to train on and to validate on, and the source record.

    Kept: status ``ok`` and ``final_reward > 0`` (the oracle's rule), or ``>= min_reward``
    when given. Files of several envs are refused: each env renders its own tools.
    ``hold_out``: at least this many kept episodes, those of the last tasks (whole tasks: a
    task's other episodes would teach its answer), validate instead of training.

    Raises:
        ConfigError: nothing kept, or nothing left to train on after the hold-out.
    """
    files: list[dict[str, Any]] = []
    episodes: list[Trajectory] = []
    for path in paths:
        read, digest = _read_trajectories(path)
        files.append({"path": str(path), "sha256": digest, "episodes": len(read)})
        episodes += read
    env_ids = sorted({_same_env(e.env_id) for e in episodes})
    if len(env_ids) > 1:
        raise ConfigError(
            f"the trajectories come from {len(env_ids)} envs ({', '.join(env_ids)}), whose "
            "tools differ; give files of one env_id per run"
        )
    # an eval writes episodes as they finish: in task order, the same episodes train the same
    # model whatever order a run happened to finish them in (stable: files keep their order)
    episodes.sort(key=lambda e: (e.task_index if e.task_index is not None else -1,
                                 e.group_index))  # fmt: skip
    reasons = [_drop_reason(e, min_reward) for e in episodes]
    dropped = Counter(r for r in reasons if r is not None)
    kept = [e for e, r in zip(episodes, reasons, strict=True) if r is None]
    if not kept:
        rule = "<= 0" if min_reward is None else f"< {min_reward}"
        raise ConfigError(
            f"no episode kept: read {len(episodes)}, dropped {dropped['status']} whose status "
            f"is not ok and {dropped['reward']} with final_reward {rule}; lower the bar with "
            "--min-reward X (keeps final_reward >= X), or record more episodes"
        )
    train, validation = _split_by_task(kept, hold_out)
    if not train:
        raise ConfigError(
            f"--target-accuracy holds back {hold_out} kept episodes (whole tasks) for validation "
            f"and {len(kept)} were kept; record more episodes (more --tasks in the eval), or "
            "drop --target-accuracy"
        )
    source = {
        "kind": "trajectories", "env_id": env_ids[0], "files": files, "min_reward": min_reward,
        "read": len(episodes), "kept": len(kept), "validation": len(validation),
        "dropped": {"status": dropped["status"], "reward": dropped["reward"]},
    }  # fmt: skip
    return [e.messages for e in train], [e.messages for e in validation], source


def _split_by_task(
    episodes: Sequence[Trajectory], hold_out: int
) -> tuple[list[Trajectory], list[Trajectory]]:
    """(train, validation): the episodes of the last tasks, whole, at least ``hold_out`` of them.

    ``episodes`` are in task order; an episode of no task index (a task given inline) is a
    task of its own.
    """
    cut = len(episodes)
    while hold_out and cut > 0 and len(episodes) - cut < hold_out:
        task = episodes[cut - 1].task_index
        cut -= 1
        while task is not None and cut > 0 and episodes[cut - 1].task_index == task:
            cut -= 1
    return list(episodes[:cut]), list(episodes[cut:])


def _read_trajectories(path: Path) -> tuple[list[Trajectory], str]:
    """The file's trajectories and its sha256; a line that is not one names its number."""
    if not path.is_file():
        raise ConfigError(
            f"--trajectories {path}: no such file; give a trajectories.jsonl that agentgym "
            "eval wrote (in its --out folder)"
        )
    data = path.read_bytes()
    try:
        episodes = list(trajectories_of_lines(data.splitlines(), path))
    except TrajectoryLineError as exc:
        raise ConfigError(
            f"--trajectories: {exc}; give JSONL that agentgym eval or write_jsonl wrote"
        ) from None
    return episodes, hashlib.sha256(data).hexdigest()


def _same_env(env_id: str) -> str:
    """The registered id of a recorded ``env_id``, else the id as it is.

    A file records the name `rollout` was given: ``calculator`` and ``agentgym/Calculator-v0``
    are one env, and must not be refused as two.
    """
    try:
        return resolve_id(env_id)
    except ConfigError:
        return env_id


def _drop_reason(episode: Trajectory, min_reward: float | None) -> str | None:
    """Why the filter drops ``episode`` (``status`` or ``reward``); None keeps it."""
    if episode.status != "ok":
        return "status"
    reward = episode.final_reward or 0.0
    kept = reward > 0 if min_reward is None else reward >= min_reward
    return None if kept else "reward"
