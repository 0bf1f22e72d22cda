"""Pre-flight checks for an env (and optionally a model's tokenizer) before any training.

Each check is a small named function returning a `CheckResult`; `check` runs them all and
never raises for a failed check, so a user sees every problem at once instead of an
assertion failure an hour into training. The rows: Gymnasium's API, the tool schemas, the
tool parameters (`_check_tool_params`), the parser's round trip, the env's reference episode,
and with a tokenizer the chat template's rows (`_check_template`), played on the reference
episode with one more tool call made after some text (templates differ most there: Llama
3.1's drops that text).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import sysconfig
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from gymnasium.utils.env_checker import check_env

from ._check_result import CheckResult
from ._check_tasks import missing_task_fields
from ._check_template import (
    Call,
    env_option,
    other_reader,
    read_calls,
    reasoning_prefix,
    template_checks,
    unshown_tools_problem,
)
from ._check_tool_params import tool_parameters
from ._env import Env
from ._errors import ConfigError, SandboxError
from ._own_loop import own_loop, run_caught
from ._policies import ScriptedPolicy
from ._registry import made_for_a_command, make
from ._rollout import EpisodeSpec, run_episode
from ._tool_schema import example_arguments
from ._trajectory import Trajectory
from ._types import Message
from .parsers import ToolCall, ToolCallParser, get_parser

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: Seconds a row that plays episodes may take by default (a code env's reference starts a
#: sandbox and runs its tests: seconds; a loaded CI machine: tens of seconds).
PLAY_SECONDS = 300.0

Row = Callable[[], "CheckResult | list[CheckResult]"]

#: The text the exercise episode writes before its extra tool call.
TEXT_BEFORE_CALL = "Let me double-check that."


def check(
    env_id: str,
    tokenizer: Any = None,
    *,
    chat_template_kwargs: dict[str, Any] | None = None,
    episode_timeout: float = PLAY_SECONDS,
    **env_kwargs: Any,
) -> list[CheckResult]:
    """Run every pre-flight check on a registered env.

    Args:
        env_id: a registered env id.
        tokenizer: a tokenizer, or the path of a model (or tokenizer) folder: its chat
            template is checked too. A ``vllm:<name>`` parser in ``env_kwargs`` is built
            with it (vLLM's parsers read their markers from the model's tokenizer).
        chat_template_kwargs: extra chat-template variables (``{"enable_thinking": False}``),
            used as the engine uses them; each must be a variable the template reads.
        episode_timeout: seconds each row that plays episodes may take; one past it fails,
            naming the likely cause (a tool or reward function that never returns).
        env_kwargs: options of the env (``parser="mistral"`` ...).

    Returns:
        One `CheckResult` per row. A row with nothing to check (the reference episode of an
        env without a reference solution) is skipped: ``skipped`` and ``passed`` are both
        true, so it fails nothing, and its ``verdict`` is ``"skip"``.

    A sandbox env's rows start the process's shared sandbox pool of its config; the pools
    started while ``check`` runs are closed on return (`closing_new_shared_pools`), so it
    leaves no container running, and the pools the process had before (a notebook's warm
    pool, a rollout running beside it) stay warm and untouched. A pool first started while it
    runs is closed even where a rollout beside it started it: start such a rollout after.

    Raises:
        ConfigError: the env id, an env option or the tokenizer path is wrong (nothing runs).
    """
    if chat_template_kwargs and tokenizer is None:
        raise ConfigError("chat_template_kwargs need a tokenizer (--model DIR) to check")
    # unknown ids and bad kwargs fail at make(), loudly; before transformers loads where the
    # parser does not need the model's tokenizer (a typo is refused in a second, not six)
    built_early = not _parser_needs_tokenizer(env_kwargs)
    if built_early:
        made_for_a_command(env_id, env_kwargs).close()
    tok = None if tokenizer is None else load_tokenizer(tokenizer)
    env_kwargs = with_model_tokenizer(env_kwargs, tok)
    if not built_early:
        made_for_a_command(env_id, env_kwargs).close()
    # the reference check and the template checks each read one played episode
    reference = functools.cache(lambda: _play(env_id, env_kwargs, _reference_script))
    wrong = functools.cache(lambda: _play_wrong_answers(env_id, env_kwargs))
    exercise = functools.cache(lambda: _exercise(env_id, env_kwargs, tok, chat_template_kwargs))
    sandboxes = _sandboxes(env_id, env_kwargs)
    # a row that plays an episode needs the sandboxes; without them it says so, once, above
    plays = _Plays(sandboxes is None or sandboxes.passed, episode_timeout)
    checks: list[Row] = [
        *([lambda: sandboxes] if sandboxes is not None else []),
        plays.row("gymnasium check_env", lambda: _gymnasium_api(env_id, env_kwargs)),
        lambda: _tool_schemas(make(env_id, **env_kwargs)),
        lambda: tool_parameters(make(env_id, **env_kwargs)),
        lambda: _parser_round_trip(make(env_id, **env_kwargs)),
        lambda: _task_fields(make(env_id, **env_kwargs)),
        plays.row(
            "reference episode", lambda: _reference_episode(reference()[0], reference()[3])
        ),
        plays.row(WRONG_ROW, lambda: _wrong_answers(reference()[0], wrong)),
    ]
    if tok is not None:
        kwargs = dict(chat_template_kwargs or {})
        checks.append(lambda: _tools_in_prompt(make(env_id, **env_kwargs), tok, kwargs))
        checks.append(plays.row("chat template", lambda: template_checks(tok, kwargs,
                                                                        *exercise())))
    results: list[CheckResult] = []
    with _closing_its_pools(sandboxes is not None):
        for run in checks:
            try:
                outcome = run()
                results.extend(outcome if isinstance(outcome, list) else [outcome])
            except Exception as exc:  # a crashing check is a failed check, not a crashed command
                results.append(CheckResult("check crashed", False,
                                           f"{type(exc).__name__}: {exc}"))
    return results


def _closing_its_pools(sandbox_env: bool) -> contextlib.AbstractContextManager[None]:
    """Closes on exit the shared pools a sandbox env's rows started, and only those.

    Why: its episodes' pool (4 warm containers) ran on after `check` returned, in a notebook
    until the kernel exited; closing every pool instead tore down the caller's warm pools and
    failed the episodes of a rollout running beside it.
    """
    if not sandbox_env:
        return contextlib.nullcontext()
    from .sandboxes._env import closing_new_shared_pools

    return closing_new_shared_pools()


def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer from an object, a model/tokenizer folder or ``tiny``; ConfigError if none."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    tokenizer = os.fspath(tokenizer)
    written_as_path = tokenizer.startswith(("/", "./", "../", "~"))
    if written_as_path and not os.path.exists(os.path.expanduser(tokenizer)):
        raise ConfigError(  # not transformers' "Repo id must be in the form 'repo_name'", and
            # before its import: a typo is refused in half a second, not three and a half
            f"no folder at {tokenizer}; pass a model folder with its tokenizer files"
        )
    try:
        from transformers import AutoTokenizer

        from .engine.tiny import tiny_model_folder
    except ImportError as exc:
        raise ConfigError(
            "reading a model's tokenizer needs transformers: pip install 'agentgym[train]' "
            "(or 'agentgym[vllm]', which brings it)"
        ) from exc
    from .engine._render import TOKENIZER_FILES, require_vocabulary

    tokenizer = str(tiny_model_folder(tokenizer) or tokenizer)  # as train and eval name it
    try:
        loaded = AutoTokenizer.from_pretrained(tokenizer)
    except Exception as exc:  # OSError, ValueError ... all mean "not a tokenizer folder"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"cannot load a tokenizer from {tokenizer!r} ({reason}); pass a model folder "
            f"with its tokenizer files ({TOKENIZER_FILES}, beside tokenizer_config.json)"
        ) from None
    require_vocabulary(loaded)
    return loaded


def with_model_tokenizer(env_kwargs: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """``env_kwargs`` with a ``vllm:<name>`` parser built on the model's tokenizer.

    vLLM's parsers find their marker tokens in a tokenizer; the default one knows only a
    few, so with a model at hand its own tokenizer is used.
    """
    if tokenizer is None or not _parser_needs_tokenizer(env_kwargs):
        return env_kwargs
    parser = env_kwargs["parser"]
    return {**env_kwargs, "parser": get_parser(parser, tokenizer=tokenizer)}


def _parser_needs_tokenizer(env_kwargs: dict[str, Any]) -> bool:
    parser = env_kwargs.get("parser")
    return isinstance(parser, str) and parser.startswith("vllm:")


def _sandboxes(env_id: str, env_kwargs: dict[str, Any]) -> CheckResult | None:
    """A sandbox env's row: its Docker daemon answers and holds its image (None: no sandboxes).

    Why first: without them every row that plays an episode failed with the same pool error,
    each after a traceback in the log.
    """
    env: Any = make(env_id, **env_kwargs)
    try:
        if not callable(getattr(env, "check_ready", None)):
            return None
        if getattr(env, "backend", "docker") != "docker":
            return CheckResult("sandboxes", True, "backend local: no Docker (not a boundary)")
        try:
            refuse_unready(env, env_id)
        except ConfigError as exc:
            return CheckResult("sandboxes", False, str(exc))
        return CheckResult("sandboxes", True, f"the Docker daemon holds {env.image!r}")
    finally:
        env.close()



class _Plays:
    """Runs the rows that play episodes, each bounded by ``seconds``.

    Why: a tool or reward function that never returns (an ``async def`` judge whose server
    went quiet) hung ``agentgym check`` for good, the one command meant to find it. A row past
    its time fails naming the likely cause; its thread is abandoned (a daemon: the command
    still exits), and the rows after it that play are skipped, since the episodes they replay
    would hang the same way.
    """

    def __init__(self, sandboxes_ready: bool, seconds: float) -> None:
        if not seconds > 0:  # nan too
            raise ConfigError(f"episode_timeout must be a number of seconds > 0, got {seconds!r}")
        self.sandboxes_ready, self.seconds = sandboxes_ready, seconds
        self.hung: str | None = None

    def row(self, name: str, run: Row) -> Row:
        """``run``, bounded; or a skipped row ``name`` when it cannot be played."""
        return lambda: self._bounded(name, run)

    def _bounded(self, name: str, run: Row) -> CheckResult | list[CheckResult]:
        if not self.sandboxes_ready:
            return CheckResult(name, True, "not played: the sandboxes are not ready (above)",
                               skipped=True)  # fmt: skip
        if self.hung is not None:
            return CheckResult(name, True, f"not played: {self.hung} did not finish (above)",
                               skipped=True)  # fmt: skip
        try:
            return bounded(run, self.seconds)
        except Hung as hung:
            self.hung = name
            return CheckResult(
                name, False,
                f"did not finish in {self.seconds:g} s: {hung.where} never returns and holds "
                f"its episode; {HUNG_FIX}, or raise --episode-timeout if it is only slow",
            )  # fmt: skip


#: How to stop a tool or reward function that never returns from holding its episode.
HUNG_FIX = "give it a timeout (@tool(timeout=...), Rubric(..., timeout=...))"

_T = TypeVar("_T")


class Hung(Exception):
    """`bounded`'s ``run`` did not return in time; ``where`` names what held it."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def bounded(run: Callable[[], _T], seconds: float) -> _T:
    """``run()`` on a daemon thread: its result, its exception, or `Hung` after ``seconds``.

    Why a thread: a sync tool or reward function that never returns holds the event loop, so
    no asyncio timeout fires; the caller's thread must be the one that stops waiting. The
    abandoned thread is a daemon, so the command still exits.
    """
    done: list[Any] = []
    worker = threading.Thread(target=_run_into, args=(run, done), daemon=True)
    worker.start()
    # inf or 1e12 overflowed the thread join's clock (`check` crashed on every row)
    worker.join(min(seconds, threading.TIMEOUT_MAX))
    if not done:
        raise Hung(_held_in(worker))
    if isinstance(done[0], BaseException):
        raise done[0]
    result: _T = done[0]
    return result


def _run_into(run: Callable[[], Any], done: list[Any]) -> None:
    """``run()``'s result, or the exception it raised, appended to ``done``."""
    try:
        done.append(run())
    except BaseException as exc:  # handed to the caller's thread, which raises it
        done.append(exc)


#: Where the interpreter's and installed packages' code lives: not the env author's.
_NOT_ENV_CODE = tuple(
    {os.path.dirname(__file__), *(sysconfig.get_paths()[k] for k in ("stdlib", "purelib",
                                                                      "platlib"))}
)  # fmt: skip


def _held_in(thread: threading.Thread) -> str:
    """The env's own function innermost on ``thread``'s stack: ``'judge' (envs/mine.py:17)``.

    Why: "a tool or reward function" sends a user reading every one of them; the stack of
    the thread still inside the episode names the one that holds it (a sync function on the
    event loop; one on a thread of its own is not on this stack, hence the fallback).
    """
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        code = frame.f_code
        if not os.path.abspath(code.co_filename).startswith(_NOT_ENV_CODE):
            return f"{code.co_name!r} ({code.co_filename}:{frame.f_lineno})"
        frame = frame.f_back
    return "a tool, reward function or env hook"


def _gymnasium_api(env_id: str, env_kwargs: dict[str, Any]) -> CheckResult:
    env = make(env_id, **env_kwargs)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env, skip_render_check=True)
    except Exception as exc:
        return CheckResult("gymnasium check_env", False, f"{type(exc).__name__}: {exc}")
    finally:
        env.close()
    notes = "; ".join(sorted({str(w.message) for w in caught}))
    return CheckResult("gymnasium check_env", True, notes or "no warnings")


def _tool_schemas(env: Env) -> CheckResult:
    """Names a server accepts and a description for every tool, as the model is shown them."""
    schemas = [s.get("function", {}) for s in getattr(env, "tool_schemas", [])]
    env.close()
    problems = [
        f"tool name {fn.get('name')!r} must match {_TOOL_NAME.pattern}"
        for fn in schemas
        if not _TOOL_NAME.match(fn.get("name", ""))
    ]
    if undescribed := undescribed_tools(schemas):
        names = ", ".join(map(repr, undescribed))
        problems.append(f"tool(s) {names} have no description: write a docstring")
    detail = "; ".join(problems) or f"{len(schemas)} tool(s) valid"
    return CheckResult("tool schemas", not problems, detail)


def _task_fields(env: Env) -> CheckResult:
    """Every task holds what the env's prompt and its reward functions read."""
    try:
        tasks = getattr(env, "tasks", None)
        problem = missing_task_fields(env)
    finally:
        env.close()
    if problem is not None:
        return CheckResult("task fields", False, problem)
    if tasks is None:
        return CheckResult("task fields", True, "the env keeps no task list to read")
    return CheckResult("task fields", True, f"{len(tasks):,} task(s), each with what is read")


def refuse_unready(env: Any, env_id: str) -> None:
    """Refuse, in one line naming the fix, an env whose sandboxes cannot start here.

    A sandbox env (``check_ready``: its Docker daemon answers and holds its image) found out
    at its first episode otherwise: after the model loaded, every episode ended
    ``infra_error``, and a short training run exited 0 having scored nothing.
    """
    check_ready = getattr(env, "check_ready", None)
    if not callable(check_ready):
        return
    try:
        check_ready()
    except SandboxError as exc:
        raise ConfigError(f"env {env_id!r} runs code in Docker sandboxes: {exc}") from None


def lists_tools(env: Any) -> bool:
    """Whether the env's own prompt shows the tools (``tool_prompt="system"``): no template."""
    return getattr(env, "tool_prompt", "template") == "system"


def _tools_in_prompt(env: Env, tokenizer: Any, kwargs: dict[str, Any]) -> CheckResult:
    """The model must see the tools: its template renders them, or the env lists them.

    The trainer refuses a run where neither does (`unshown_tools_problem`); the check says so
    first.
    """
    from .engine import ChatRenderer, TemplateError

    row = "tools in the prompt"
    tools, env_lists = getattr(env, "tool_schemas", []), lists_tools(env)
    env.close()
    if not tools:
        return CheckResult(row, True, "the env has no tools", skipped=True)
    if env_lists:
        return CheckResult(row, True, "the env's system prompt lists them (tool_prompt='system')")
    try:
        problem = unshown_tools_problem(ChatRenderer(tokenizer, kwargs), tools)
    except TemplateError as exc:  # the chat template's rows say what is wrong with it
        return CheckResult(row, True, f"not checked: {exc}", skipped=True)
    return CheckResult(row, not problem, problem or "the chat template renders them")


def undescribed_tools(schemas: Sequence[dict[str, Any]]) -> list[str]:
    """The names of the tools shown to the model by name alone (no description).

    The check's row fails them, and the trainer's pre-flight refuses them.
    """
    functions = [schema.get("function", schema) for schema in schemas if isinstance(schema, dict)]
    return [str(fn.get("name")) for fn in functions if not fn.get("description")]


def _parser_round_trip(env: Env) -> CheckResult:
    parser = getattr(env, "parser", None)
    if parser is None:
        return CheckResult("parser round trip", True, "env has no tool-call parser")
    calls = [
        ToolCall(t.name, example_arguments(t.parameters))
        for t in getattr(env, "tools", {}).values()
    ]
    env.close()
    name = f"parser round trip ({parser.name})"
    try:
        text = parser.render("Let me check.", calls)
    except NotImplementedError as exc:  # a parse-only parser (vllm:openai): nothing to compare
        return CheckResult(name, True, f"cannot render, so not checked: {exc}")
    parsed = parser.parse(text)
    got = [(c.name, c.arguments) for c in parsed.tool_calls]
    want = [(c.name, c.arguments) for c in calls]
    if got == want and not parsed.errors:
        return CheckResult(name, True, "ok")
    read = f"read {got}" if got else "read no call"
    errors = f" ({'; '.join(parsed.errors)})" if parsed.errors else ""
    why = _unread_after_text(parser, calls, want, text) if not got else ""
    return CheckResult(name, False, f"rendered {text[:120]!r}, {read}{errors}{why}")


def _unread_after_text(
    parser: ToolCallParser, calls: list[ToolCall], want: list[Call], text: str
) -> str:
    """Why no call was read, when the parser reads the calls alone but not after text.

    vLLM's pythonic parser reads a call list only when it is the whole turn: a model that
    writes a word first calls no tool. The fix is a shipped parser that reads ``text``.
    """
    if read_calls(parser, parser.render("", calls)) != want:
        return ""
    fix = other_reader(text, want, parser)
    return (
        f": {parser.name!r} reads calls only when they are the whole turn, so a model that "
        "writes text before its calls calls no tool"
        + (f"; use {env_option('parser', fix)}, which reads them after text too" if fix else "")
    )


# ---- the played episodes ----------------------------------------------------------------
Script = Callable[[Env], Callable[[Any], Sequence[str]] | None]


def _reference_script(env: Env) -> Callable[[Any], Sequence[str]] | None:
    """The env's own reference turns."""
    return getattr(env, "reference_turns", None)


#: A wrong answer every env's reward must pay less than its reference: no call, no attempt.
NON_ANSWER = "I cannot answer this."
#: How many other tasks' reference solutions are played on task 0 as its wrong answers.
OTHER_TASKS = 2
#: How far into the tasks the check looks for ones whose answer differs from task 0's.
OTHER_TASKS_SEARCHED = 100
WRONG_ROW = "reward of wrong answers"


def _give_up_script(env: Env) -> Callable[[Any], Sequence[str]] | None:
    """One turn that gives up at once, for envs with a reference to compare it with."""
    return None if _reference_script(env) is None else (lambda task: [NON_ANSWER])


def _other_task_script(k: int) -> Script:
    """Task ``k``'s reference turns, whatever task is played: a well-formed wrong answer."""

    def script(env: Env) -> Callable[[Any], Sequence[str]] | None:
        reference, tasks = _reference_script(env), getattr(env, "tasks", ())
        if reference is None or len(tasks) <= k:
            return None
        return lambda task: reference(tasks[k])

    return script


def _play_wrong_answers(
    env_id: str, env_kwargs: dict[str, Any]
) -> list[tuple[str, Trajectory | None]]:
    """(label, episode) of each wrong answer played on task 0 (`_wrong_answer_scripts`)."""
    return [(label, _play(env_id, env_kwargs, script)[0])
            for label, script in _wrong_answer_scripts(env_id, env_kwargs)]  # fmt: skip


def _wrong_answer_scripts(env_id: str, env_kwargs: dict[str, Any]) -> list[tuple[str, Script]]:
    """(label, script) of each wrong answer the check plays on task 0."""
    env = make(env_id, **env_kwargs)
    try:
        tasks: Sequence[Any] = getattr(env, "tasks", ())
        others = _other_tasks(tasks) if len(tasks) else []
    finally:
        env.close()
    wrong = [(f"task {k}'s solution", _other_task_script(k)) for k in others]
    return [(repr(NON_ANSWER), _give_up_script), *wrong]


def _other_tasks(tasks: Sequence[Any]) -> list[int]:
    """The tasks whose solutions are wrong answers for task 0: the first with another answer.

    Why: where tasks share answers (yes/no, a few labels), task 1's solution can be task 0's
    right answer, and a reward paying it is no flaw; tasks without an ``answer`` are taken
    in order.
    """
    first = _answer(tasks[0])
    searched = range(1, min(len(tasks), OTHER_TASKS_SEARCHED))
    return [k for k in searched if first is None or _answer(tasks[k]) != first][:OTHER_TASKS]


def _answer(task: Any) -> Any:
    return task.get("answer") if isinstance(task, Mapping) else None


def _exercise_script(env: Env, reasoning: str = "") -> Callable[[Any], Sequence[str]] | None:
    """The reference turns with the first tool turn repeated after some text.

    Several tool turns, and a call that follows text, are what chat templates get wrong
    (a last message rendered differently, text before a call dropped); most references
    have one call and no text. ``reasoning`` opens every turn, as a thinking model's do.
    """
    reference = _reference_script(env)
    parser: ToolCallParser | None = getattr(env, "parser", None)
    if reference is None or parser is None:
        return reference

    def turns(task: Any) -> Sequence[str]:
        script = list(reference(task) or ())
        for k, text in enumerate(script):
            calls = [ToolCall(c.name, c.arguments) for c in parser.parse(text).tool_calls]
            if calls:
                again = parser.render(TEXT_BEFORE_CALL, calls)
                script = [*script[: k + 1], again, *script[k + 1 :]]
                break
        return [reasoning + text for text in script]

    return turns


def _exercise(
    env_id: str, env_kwargs: dict[str, Any], tokenizer: Any, kwargs: dict[str, Any] | None
) -> tuple[Trajectory | None, list[dict[str, Any]], ToolCallParser | None, str]:
    """The exercise episode (see `_exercise_script`), with reasoning if the model thinks."""
    env = make(env_id, **env_kwargs)
    tools = getattr(env, "tool_schemas", [])
    env.close()
    reasoning = "" if tokenizer is None else reasoning_prefix(tokenizer, kwargs or {}, tools)
    return _play(env_id, env_kwargs, lambda env: _exercise_script(env, reasoning))


def _play(
    env_id: str, env_kwargs: dict[str, Any], script: Script
) -> tuple[Trajectory | None, list[dict[str, Any]], ToolCallParser | None, str]:
    """Play task 0 with ``script``'s turns: (trajectory, tools, parser, why no trajectory).

    The trajectory is None when the env has no tasks or no reference solution, or when its
    reference cannot be written with the env's parser (the reason says so).
    """
    env = make(env_id, **env_kwargs)
    turns = script(env)
    tasks: Sequence[Any] = getattr(env, "tasks", ())
    task = tasks[0] if len(tasks) else None
    tools, parser = getattr(env, "tool_schemas", []), getattr(env, "parser", None)
    env.close()
    if turns is None or task is None:
        return None, tools, parser, "the env has no reference solution"
    try:
        if turns(task) is None:
            return None, tools, parser, "the env has no reference solution for task 0"
    except NotImplementedError as exc:  # a parse-only parser cannot write the reference
        return None, tools, parser, f"cannot render its reference turns: {exc}"
    with own_loop("check()") as loop:
        trajectory = run_caught(loop, run_episode(
            lambda: make(env_id, **env_kwargs), ScriptedPolicy(turns), EpisodeSpec(0, 0, 0, 0)
        ))  # fmt: skip
    return trajectory, tools, parser, ""


def _reference_episode(trajectory: Trajectory | None, why_none: str) -> CheckResult:
    """The env's own solution must play and earn a reward; with none, the row is skipped.

    A reference whose tool calls failed warns: a tool that fails every call (it raises, or
    returns an object that is not JSON data) passed, as the reference answered anyway.
    """
    if trajectory is None:
        return CheckResult("reference episode", True, f"skipped: {why_none}", skipped=True)
    earned = (trajectory.final_reward or 0) > 0
    ok = trajectory.status in ("ok", "truncated") and earned
    detail = f"status {trajectory.status}, reward {trajectory.final_reward}"
    if trajectory.error:
        detail += f": {_error_summary(trajectory.error)}"
    elif not earned and not trajectory.scores:
        detail += ": the env's own reference solution earns nothing because its rubric scores "
        detail += "nothing (give the env rubric=Rubric([...]))"
    elif not earned:
        detail += (
            f": the env's own reference solution earns nothing (scores {trajectory.scores}); "
            "the reference or the reward functions are wrong"
        )
    errors = [error for turn in trajectory.turns for error in turn.tool_errors]
    if errors:
        first = (errors[0].strip().splitlines() or [""])[0]
        detail += (
            f"; {len(errors)} tool error(s) in its turns, the first: {first} (fix the tool, "
            "or the call the reference makes)"
        )
    return CheckResult(
        "reference episode", ok, detail, trace=trajectory.error or "", warning=ok and bool(errors)
    )


def _wrong_answers(
    reference: Trajectory | None, wrong: Callable[[], list[tuple[str, Trajectory | None]]]
) -> CheckResult:
    """Wrong answers on task 0 must earn less than its reference solution.

    Played: `NON_ANSWER` at once, and other tasks' reference solutions (well-formed, tools
    called, the wrong answer for this task). Warns when the non-answer is paid as much as the
    reference, or when every other task's solution is: a rubric that pays any reply, a format
    or any number pays a policy that solves nothing, and GRPO then raises the reward and
    nothing else. Warns rather than fails: the reward is the env author's. ``wrong`` plays
    them only when the reference earns something to compare with (three episodes saved, each
    a sandbox start in a code env).
    """
    if reference is None:
        return CheckResult(WRONG_ROW, True, "skipped: the env has no reference solution",
                           skipped=True)  # fmt: skip
    earned = reference.total_reward
    if earned <= 0:
        return CheckResult(WRONG_ROW, True, "skipped: the reference earns 0", skipped=True)
    played = [(label, t) for label, t in wrong() if t is not None and t.status != "error"]
    if not played:
        return CheckResult(WRONG_ROW, True, "skipped: no wrong answer could be played",
                           skipped=True)  # fmt: skip
    paid = [(label, t) for label, t in played if t.total_reward >= earned]
    others = {label for label, _ in played} - {repr(NON_ANSWER)}
    paid_labels = {label for label, _ in paid}
    earnings = ", ".join(f"{label} {t.total_reward:g}" for label, t in played)
    if repr(NON_ANSWER) not in paid_labels and not (others and others <= paid_labels):
        return CheckResult(WRONG_ROW, True, f"on task 0 {earnings}; its reference {earned:g}")
    label, example = paid[0]
    scores = ", ".join(f"{k} {v:g}" for k, v in example.scores.items())
    which = " and ".join(label for label, _ in paid)
    return CheckResult(
        WRONG_ROW, True, warning=True,
        detail=f"on task 0 {earnings}, its reference {earned:g}: {which} paid as much, so the "
        "reward does not check the outcome and training can raise it without solving a task "
        f"(scores of {label}: {scores})",
    )


#: The line `_record_outcome` writes above each failing reward function's traceback.
_REWARD_ERROR = re.compile(r"^(reward function .+):$", re.MULTILINE)


def _error_summary(error: str) -> str:
    """A recorded error as one line per cause: ``reward function 'f' raised ValueError: x``.

    Why: the full traceback, wrapped into a table cell, buries the one line that matters.
    """
    parts = _REWARD_ERROR.split(error)  # [before, header, traceback, header, traceback ...]
    causes = [f"{head} raised {_last_line(body)}" for head, body in zip(parts[1::2], parts[2::2])]
    if parts[0].strip():
        causes.insert(0, f"the episode raised {_last_line(parts[0])}")
    return "; ".join(causes)


def _last_line(traceback_text: str) -> str:
    """The exception line of a traceback: its last non-blank line."""
    lines = [line.strip() for line in traceback_text.splitlines() if line.strip()]
    return lines[-1] if lines else "an error"


def reference_conversation(
    env_id: str,
    env_kwargs: dict[str, Any],
    tokenizer: Any = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    seconds: float | None = None,
) -> list[Message] | None:
    """The env's exercise episode as messages: what `agentgym check` decides the mode on.

    Giving it to `TokenPolicy.mode_for` makes a rollout decide on the same conversation. With
    the model's tokenizer, turns open with reasoning if its template expects that. None when
    the env has no playable reference. With ``seconds``, an episode that takes longer raises
    `Hung` (`bounded`); None waits for it.
    """

    def play() -> Trajectory | None:
        return _exercise(env_id, env_kwargs, tokenizer, chat_template_kwargs)[0]

    trajectory = play() if seconds is None else bounded(play, seconds)
    if trajectory is None or not any(m.get("role") == "assistant" for m in trajectory.messages):
        return None
    return trajectory.messages
