"""Trajectory: everything one episode produced, at token level, in a lossless JSONL form.

The trainer consumes trajectories without re-tokenizing: each `Turn` keeps the exact token
ids the policy saw and produced, so what is trained is what was sampled.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._errors import ConfigError
from ._json import is_array
from ._types import Completion, sampled_tokens

#: ``ok``: ended on its own (final answer or a stop condition); ``truncated``: hit max turns or
#: the token budget; ``error``: the env, a tool loop or a reward function raised (traceback in
#: ``error``); ``infra_error``: the model backend or sandbox failed, so the reward says nothing
#: about the policy and trainers must drop the episode from group statistics; ``late``: the
#: rollout's deadline (`arollout(deadline=...)`) passed first, so the episode was cut where it
#: stood (or never started): its partial turns are kept, it has no reward, and trainers drop it
#: from group statistics as they drop ``infra_error`` (scoring it 0 would punish the policy for
#: the machine's speed; dropping favours fast episodes, so set deadlines that few episodes miss).
Status = Literal["ok", "truncated", "error", "infra_error", "late"]
STATUSES: tuple[str, ...] = ("ok", "truncated", "error", "infra_error", "late")


class PrefixMismatchError(ValueError):
    """Turn k+1's prompt does not extend turn k's prompt + completion (history was rewritten)."""


#: The largest reward magnitude an episode carries. Past it a group's statistics overflow:
#: rewards of 1e200 made the trainer's step raise OverflowError (the std squares them), and
#: an infinite one made every advantage of its group NaN. No real reward comes near it.
MAX_ABS_REWARD = 1e12


@dataclass
class Turn:
    """One policy call and the env's answer to it.

    ``completion_mask`` has one entry per completion token: 1 for tokens the model sampled
    (trained on), 0 for tokens that must not be trained (e.g. forced by the env). Prompt tokens
    are never trained. Token fields are None when the backend did not report them.
    ``adapter_version`` is the LoRA adapter version that sampled the turn (0: base weights;
    None: the backend does not serve adapters). ``tool_results_cut`` counts the turn's tool
    results the env cut to its ``max_tool_result_chars``: the model read only their start.
    ``completion_tokens`` is the server's own count of the turn's sampled tokens where it
    returned no ids (`Completion`), for the eval's token figures; None in files written before.
    """

    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    completion_mask: list[int] | None = None
    text: str = ""
    finish_reason: str | None = None
    reward: float = 0.0
    tool_errors: list[str] = field(default_factory=list)
    tool_results_cut: int = 0
    policy_seconds: float = 0.0
    env_seconds: float = 0.0
    adapter_version: int | None = None
    completion_tokens: int | None = None

    @classmethod
    def from_completion(cls, completion: Completion, **fields: Any) -> Turn:
        """The turn a policy produced, every token marked as sampled; ``fields`` add the rest."""
        ids = completion.completion_ids
        return cls(  # the first six by position, in field order: a third faster, every step
            completion.prompt_ids,
            ids,
            completion.logprobs,
            [1] * len(ids) if ids is not None else None,
            completion.text,
            completion.finish_reason,
            adapter_version=completion.adapter_version,
            completion_tokens=completion.completion_tokens,
            **fields,
        )

    @property
    def sampled_tokens(self) -> int | None:
        """How many tokens the turn sampled (`agentgym._types.sampled_tokens`)."""
        return sampled_tokens(self.completion_ids, self.completion_tokens)


@dataclass
class Trajectory:
    """One episode: the conversation, its turns, rewards and outcome.

    ``task_index`` is the task's index in the env's dataset (None for a task given as a dict);
    ``task_position`` is its position in the task list the rollout played, so
    ``(task_position, group_index)`` (`key`) names the episode in its run even when tasks
    are dicts. ``mode`` is how the episode trains: ``"concat"`` (each prompt extends the
    previous turns' exact ids: one sequence, `flatten`) or ``"per_turn"`` (prompts were
    rendered afresh: one sample per turn); None until an episode handle ran it.
    """

    env_id: str
    task: Any = None
    task_index: int | None = None
    task_position: int | None = None
    group_index: int = 0
    seed: int | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    final_reward: float | None = None
    scores: dict[str, float | None] = field(default_factory=dict)
    status: Status = "ok"
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    mode: str | None = None

    @property
    def key(self) -> tuple[int | None, int]:
        """``(task_position, group_index)``: what `arollout(skip=...)` matches on resume."""
        return self.task_position, self.group_index

    @property
    def step_rewards(self) -> list[float]:
        """Per-turn rewards, in order."""
        return [t.reward for t in self.turns]

    @property
    def total_reward(self) -> float:
        """Sum of step rewards plus the final reward (0 if none was computed)."""
        return sum(self.step_rewards) + (self.final_reward or 0.0)

    def flatten(self) -> tuple[list[int], list[int], list[float | None]]:
        """One training sequence: (token ids, loss mask, logprobs) over the whole episode.

        Valid only when every turn's prompt extends the previous prompt + completion exactly
        (the chat template keeps history as a token prefix; `agentgym check` tests this).
        Env/tool tokens get mask 0 and logprob None.

        Raises:
            PrefixMismatchError: a later prompt is not an extension; train per turn instead.
            ValueError: token ids are missing (the backend did not return them).
        """
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float | None] = []
        for k, turn in enumerate(self.turns):
            if turn.prompt_ids is None or turn.completion_ids is None:
                raise ValueError(f"turn {k} has no token ids; use a backend that returns them")
            if turn.prompt_ids[: len(ids)] != ids:
                raise PrefixMismatchError(
                    f"turn {k}'s prompt does not extend the previous turns' tokens; "
                    "train on per-turn samples instead"
                )
            env_tokens = turn.prompt_ids[len(ids) :]
            ids += env_tokens + turn.completion_ids
            mask += [0] * len(env_tokens) + (turn.completion_mask or [1] * len(turn.completion_ids))
            logprobs += [None] * len(env_tokens)
            logprobs += turn.logprobs or [None] * len(turn.completion_ids)
        return ids, mask, logprobs

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `from_dict` inverts it exactly."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """Rebuild a trajectory from `to_dict` output.

        Keys this version does not know (a file from a newer agentgym) are left out, so old
        code still reads new files; a record that is not a trajectory at all is refused.
        """
        if not isinstance(data, dict) or "env_id" not in data:
            keys = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ConfigError(
                f"not a trajectory record (keys {keys}); trajectories are what write_jsonl "
                "and agentgym eval write; read task files with agentgym.load_tasks"
            )
        data = _known(cls, data)
        data["turns"] = [Turn(**_known(Turn, t)) for t in data.get("turns", [])]
        return cls(**data)


def _known(kind: type, data: dict[str, Any]) -> dict[str, Any]:
    names = _field_names(kind)
    return {k: v for k, v in data.items() if k in names}


@functools.cache
def _field_names(kind: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(kind))


def to_json_line(trajectory: Trajectory) -> str:
    r"""One JSONL line (with its newline) for ``trajectory``, always valid UTF-8.

    A lone surrogate is written as its JSON escape (``\ud800``), which reads back as the same
    text. Why: a server may answer one (a JSON ``"\ud800"``, half of an emoji cut at the token
    limit), which UTF-8 cannot encode: writing that episode raised, and an eval died mid-run,
    and again at every ``--resume``.
    """
    line = json.dumps(trajectory.to_dict(), ensure_ascii=False, default=_line_data) + "\n"
    if line.isascii():  # the usual line: nothing to check
        return line
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return line.encode("utf-8", "backslashreplace").decode("utf-8")
    return line


def _line_data(value: Any) -> Any:
    """What JSON cannot write itself: numpy/torch numbers as numbers, anything else as text.

    Why: a task's ``np.int64(7)`` came back as ``"7"``, and a reward that re-scored the read
    episodes changed.
    """
    return value.tolist() if is_array(value) else str(value)


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> int:
    """Write one trajectory per line, atomically (temp file, then rename); return the count.

    Missing parent folders are made (``runs/eval.jsonl`` in a fresh checkout).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for trajectory in trajectories:
                f.write(to_json_line(trajectory))
                count += 1
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return count


class TrajectoryLineError(ConfigError):
    """A line of a trajectories file that is not a trajectory; names the file and the line.

    Why one error: a bare JSON traceback named neither, and each reader (eval --resume,
    `agentgym sft`) re-read the file to find the line.
    """

    def __init__(self, path: str | Path, line: int, reason: str) -> None:
        super().__init__(f"line {line} of {path} is not a trajectory ({reason})")
        self.path, self.line, self.reason = Path(path), line, reason


def trajectories_of_lines(lines: Iterable[str | bytes], path: str | Path) -> Iterator[Trajectory]:
    """The trajectories of JSONL ``lines`` (blank lines skipped) read from ``path``.

    Raises:
        TrajectoryLineError: a line is not JSON, or not a trajectory record.
    """
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield Trajectory.from_dict(json.loads(line))
        except json.JSONDecodeError as exc:  # UnicodeDecodeError below: a ValueError too
            raise TrajectoryLineError(path, number, f"not JSON: {exc.msg}") from None
        except (ValueError, TypeError) as exc:  # a record of other fields, or bad UTF-8
            raise TrajectoryLineError(path, number, str(exc)) from None


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Yield the trajectories of a file written by `write_jsonl`.

    Raises:
        TrajectoryLineError: a line is not a trajectory (the error names it).
    """
    with Path(path).open("rb") as f:
        yield from trajectories_of_lines(f, path)


def recover_jsonl(path: str | Path) -> list[Trajectory]:
    """Trajectories of a streamed file whose writer may have been killed mid-line.

    Complete lines are kept; a torn last line (no newline) is cut off the file, so appending
    can continue cleanly. This is how `agentgym eval --resume` picks up a killed run.
    """
    path = Path(path)
    data = path.read_bytes()
    complete = _whole_lines(data)
    if len(complete) != len(data):
        with path.open("r+b") as f:
            f.truncate(len(complete))
    return list(trajectories_of_lines(io.BytesIO(complete), path))


def read_whole_lines(path: str | Path) -> list[Trajectory]:
    """`recover_jsonl` for a reader: a torn last line is left out, and left in the file.

    Why: a file another process may still be writing (a running eval's) is read, not repaired.
    """
    return list(trajectories_of_lines(io.BytesIO(_whole_lines(Path(path).read_bytes())), path))


def _whole_lines(data: bytes) -> bytes:
    """``data`` up to its last newline: what a writer killed mid-line finished."""
    return data[: data.rfind(b"\n") + 1]
