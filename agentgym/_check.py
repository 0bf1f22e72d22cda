"""Pre-flight checks for an env (and optionally a model's tokenizer) before any training.

Each check is a small named function returning a `CheckResult`; `check` runs them all and
never raises for a failed check, so a user sees every problem at once instead of an
assertion failure an hour into training.

With a tokenizer, the model's chat template is exercised exactly as the rollout engine uses it
(`agentgym.engine.ChatRenderer`), on the env's reference episode with one more tool call made
after some text (templates differ most there: Llama 3.1's drops that text): the ``rollout
mode`` row says whether episodes train as one sequence (``concat``) or one sample per turn
(``per_turn``) and why; the round-trip row says whether the template writes each assistant
turn as the model produced it, and if not, which cause.
"""

from __future__ import annotations

import asyncio
import difflib
import enum
import functools
import inspect
import os
import re
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import docstring_parser
from gymnasium.utils.env_checker import check_env

from ._env import Env
from ._errors import ConfigError
from ._policies import ScriptedPolicy
from ._registry import make
from ._rollout import EpisodeSpec, run_episode
from ._tool_schema import example_arguments
from ._tools import Tool, _described_function
from ._trajectory import Trajectory
from ._types import Message
from .parsers import ToolCall, ToolCallParser, available_parsers, get_parser

if TYPE_CHECKING:
    from .engine import ChatRenderer

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: The text the exercise episode writes before its extra tool call.
TEXT_BEFORE_CALL = "Let me double-check that."
#: The reasoning of each exercise turn when the model thinks (no digits: answers stay right).
REASONING = "The tool gives the exact result, so I use it."
#: Marks where an assistant turn's content starts in a render; no template rewrites it.
_SENTINEL = "\u2063agentgym-content\u2063"


@dataclass
class CheckResult:
    """One named check: passed or not, and what it found.

    ``skipped`` marks a check that had nothing to check (an env without a reference
    solution): it counts as passed, so it never fails a run, yet a report must not show it
    as a pass. ``trace`` holds a failure's full traceback; ``detail`` stays one line per
    problem, readable in a table cell.
    """

    name: str
    passed: bool
    detail: str = ""
    skipped: bool = False
    trace: str = ""

    @property
    def verdict(self) -> str:
        """What a report shows: ``pass``, ``skip`` or ``FAIL``."""
        if not self.passed:
            return "FAIL"
        return "skip" if self.skipped else "pass"


def check(
    env_id: str,
    tokenizer: Any = None,
    *,
    chat_template_kwargs: dict[str, Any] | None = None,
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
        env_kwargs: options of the env (``parser="mistral"`` ...).

    Returns:
        One `CheckResult` per row. A row with nothing to check (the reference episode of an
        env without a reference solution) is skipped: ``skipped`` and ``passed`` are both
        true, so it fails nothing, and its ``verdict`` is ``"skip"``.

    Raises:
        ConfigError: the env id, an env option or the tokenizer path is wrong (nothing runs).
    """
    if chat_template_kwargs and tokenizer is None:
        raise ConfigError("chat_template_kwargs need a tokenizer (--model DIR) to check")
    # unknown ids and bad kwargs fail at make(), loudly; before transformers loads where the
    # parser does not need the model's tokenizer (a typo is refused in a second, not six)
    built_early = not _parser_needs_tokenizer(env_kwargs)
    if built_early:
        make(env_id, **env_kwargs).close()
    tok = None if tokenizer is None else load_tokenizer(tokenizer)
    env_kwargs = with_model_tokenizer(env_kwargs, tok)
    if not built_early:
        make(env_id, **env_kwargs).close()
    # the reference check and the template checks each read one played episode
    reference = functools.cache(lambda: _play(env_id, env_kwargs, _reference_script))
    exercise = functools.cache(lambda: _exercise(env_id, env_kwargs, tok, chat_template_kwargs))
    checks: list[Callable[[], CheckResult | list[CheckResult]]] = [
        lambda: _gymnasium_api(env_id, env_kwargs),
        lambda: _tool_schemas(make(env_id, **env_kwargs)),
        lambda: _tool_parameters(make(env_id, **env_kwargs)),
        lambda: _parser_round_trip(make(env_id, **env_kwargs)),
        lambda: _reference_episode(*reference()),
    ]
    if tok is not None:
        kwargs = dict(chat_template_kwargs or {})
        checks.append(lambda: _template_checks(tok, kwargs, *exercise()))
    results: list[CheckResult] = []
    for run in checks:
        try:
            outcome = run()
            results.extend(outcome if isinstance(outcome, list) else [outcome])
        except Exception as exc:  # a crashing check is a failed check, not a crashed command
            results.append(CheckResult("check crashed", False, f"{type(exc).__name__}: {exc}"))
    return results


def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object from an object or a model/tokenizer folder; ConfigError if none."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    tokenizer = os.fspath(tokenizer)
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConfigError(
            "reading a model's tokenizer needs transformers: pip install 'agentgym[train]' "
            "(or 'agentgym[vllm]', which brings it)"
        ) from exc
    from .engine._render import TOKENIZER_FILES, require_vocabulary

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
    if undescribed := [repr(fn.get("name")) for fn in schemas if not fn.get("description")]:
        problems.append(f"tool(s) {', '.join(undescribed)} have no description: write a docstring")
    detail = "; ".join(problems) or f"{len(schemas)} tool(s) valid"
    return CheckResult("tool schemas", not problems, detail)


#: What the env fills each injected name with, for messages (`ToolEnv.tool_context`).
_FILLED_WITH = {
    "task": "the env's task dict",
    "state": "the episode's state",
    "messages": "the conversation so far",
    "env": "the env itself",
    "sandbox": "the episode's sandbox",
}
#: Annotations of a value a model sends: never what the env injects under any name.
_MODEL_VALUES = (str, int, float, bool, bytes)


@dataclass
class _Described:
    """A tool whose schema was built from its function: the signature and the Args: lines."""

    tool: Tool
    params: Mapping[str, inspect.Parameter]
    docs: dict[str, str]
    hints: dict[str, Any]


def _tool_parameters(env: Env) -> CheckResult:
    """Each tool's docstring against its signature, and its injected parameters.

    A documented parameter the function lacks (``town`` documented, ``city`` taken) means
    the model is shown a schema without the description the author wrote. A parameter
    named like an injected one (`agentgym._tools.INJECTABLE`: ``task``, ``state`` ...) is
    filled by the env and hidden from the model, by design; documented in ``Args:`` (unless
    its line says it is injected) or annotated as a value the model would send, it was
    meant as the model's argument, and the model can never give it. Parameters with no
    description are named, all of them, without failing the check (a clear name may do).
    Tools built from a raw schema (MCP, OpenAPI) have no signature to compare.
    """
    tools = list(getattr(env, "tools", {}).values())
    env.close()
    described = [d for d in map(_described, tools) if d is not None]
    problems = [p for d in described for p in _parameter_problems(d)]
    undocumented = [
        f"{d.tool.name!r} ({', '.join(names)})"
        for d in described
        if (names := [p for p in d.params if p not in d.docs and p not in d.tool.injected])
    ]
    detail = "; ".join(problems) or f"{len(described)} tool(s) built from functions checked"
    if undocumented:
        detail += f"; parameters with no description: {'; '.join(undocumented)}"
    return CheckResult("tool parameters", not problems, detail)


def _described(tool: Tool) -> _Described | None:
    """The signature and docstring a tool's schema was built from; None for a raw schema."""
    try:
        fn = _described_function(tool.fn)
        params = inspect.signature(fn).parameters
    except (ConfigError, TypeError, ValueError):  # a builtin, a partial: no signature
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None  # a wrapper around a raw schema (MCP, OpenAPI): **arguments
    docs = {
        p.arg_name: p.description or ""
        for p in docstring_parser.parse(inspect.getdoc(fn) or "").params
        if p.args[0] != "attribute"
    }
    return _Described(tool, params, docs, _hints(fn))


def _parameter_problems(d: _Described) -> list[str]:
    """Stray Args: entries and injected parameters meant for the model (see above)."""
    problems = []
    if stray := [name for name in d.docs if name not in d.params]:
        shown = ", ".join(repr(p) for p in d.params if p not in d.tool.injected) or "none"
        problems.append(
            f"tool {d.tool.name!r}: its docstring's Args: documents "
            f"{', '.join(map(repr, stray))}, which it does not take (its parameters: {shown}); "
            "make the names match"
        )
    for name in sorted(d.tool.injected & d.params.keys()):
        if why := _meant_for_the_model(name, d.docs.get(name), d.hints.get(name, Any)):
            problems.append(
                f"tool {d.tool.name!r}: parameter {name!r} is {why}, as if the model gave it, "
                f"but the model never sees it: {name!r} is filled with "
                f"{_FILLED_WITH.get(name, 'a value of the env')}; rename it"
            )
    return problems


def _meant_for_the_model(name: str, doc: str | None, hint: Any) -> str:
    """How an injected parameter looks like the model's argument; "" when it does not."""
    signs = []
    if doc is not None and "inject" not in doc.lower():
        signs.append(f"documented in Args: ({doc!r})")
    if not _injectable_hint(name, hint):
        signs.append(f"annotated {hint.__name__ if isinstance(hint, type) else hint}")
    return " and ".join(signs)


def _injectable_hint(name: str, hint: Any) -> bool:
    """Whether ``hint`` can describe what the env injects under ``name``.

    ``task`` is a dict (a mapping type, a TypedDict, Any); no injected value is a string,
    number, bool, Literal or Enum: the values a model sends.
    """
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _injectable_hint(name, typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return all(_injectable_hint(name, a) for a in typing.get_args(hint) if a is not type(None))
    base = origin or hint
    if hint is Any or base is object:
        return True
    if base is typing.Literal:
        return False
    if not isinstance(base, type):  # a TypeVar, a NewType ...: given the benefit of the doubt
        return True
    if name == "task":
        return issubclass(base, Mapping)  # dict, Mapping, a TypedDict
    return not issubclass(base, (*_MODEL_VALUES, enum.Enum))


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s resolved annotations; none where they do not resolve (they are not checked)."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # a forward reference only a type checker resolves
        return {}


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
        parsed = parser.parse(parser.render("Let me check.", calls))
    except NotImplementedError as exc:  # a parse-only parser (vllm:openai): nothing to compare
        return CheckResult(name, True, f"cannot render, so not checked: {exc}")
    got = [(c.name, c.arguments) for c in parsed.tool_calls]
    want = [(c.name, c.arguments) for c in calls]
    ok = got == want and not parsed.errors
    return CheckResult(name, ok, "ok" if ok else f"rendered {want}, parsed {got} {parsed.errors}")


# ---- the played episodes ----------------------------------------------------------------
Script = Callable[[Env], Callable[[Any], Sequence[str]] | None]


def _reference_script(env: Env) -> Callable[[Any], Sequence[str]] | None:
    """The env's own reference turns."""
    return getattr(env, "reference_turns", None)


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
    reasoning = "" if tokenizer is None else _reasoning_prefix(tokenizer, kwargs or {}, tools)
    return _play(env_id, env_kwargs, lambda env: _exercise_script(env, reasoning))


def _reasoning_prefix(tokenizer: Any, kwargs: dict[str, Any], tools: list[dict[str, Any]]) -> str:
    """A short ``<think>`` block when the template expects the model to open with one.

    Such a template (Qwen3 with thinking on) writes an empty ``<think></think>`` before the
    content of a finished turn that has none, but its generation prompt stops before it: the
    model writes the block. Without reasoning in the turns, the check would judge the
    template on empty blocks (which Qwen3 drops), not on what a thinking model samples.
    """
    from .engine import ChatRenderer, TemplateError

    user = [{"role": "user", "content": "hi"}]
    try:
        renderer = ChatRenderer(tokenizer, kwargs)
        prompt = renderer.render_text(user, tools or None, generation=True)
        finished = [*user, {"role": "assistant", "content": _SENTINEL}]
        last = renderer.render_text(finished, tools or None, generation=False)
    except TemplateError:  # the template rows say why
        return ""
    opening = last[len(prompt) : last.find(_SENTINEL)] if last.startswith(prompt) else ""
    thinks = re.fullmatch(r"\s*<think>\s*</think>\s*", opening) is not None
    return f"<think>\n{REASONING}\n</think>\n\n" if thinks else ""


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
    trajectory = asyncio.run(
        run_episode(
            lambda: make(env_id, **env_kwargs), ScriptedPolicy(turns), EpisodeSpec(0, 0, 0, 0)
        )
    )
    return trajectory, tools, parser, ""


def _reference_episode(
    trajectory: Trajectory | None, tools: list[Any], parser: Any, why_none: str
) -> CheckResult:
    """The env's own solution must play and earn a reward; with none, the row is skipped."""
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
    return CheckResult("reference episode", ok, detail, trace=trajectory.error or "")


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
) -> list[Message] | None:
    """The env's exercise episode as messages: what `agentgym check` decides the mode on.

    Giving it to `TokenPolicy.mode_for` makes a rollout decide on the same conversation. With
    the model's tokenizer, turns open with reasoning if its template expects that. None when
    the env has no playable reference.
    """
    trajectory = _exercise(env_id, env_kwargs, tokenizer, chat_template_kwargs)[0]
    if trajectory is None or not any(m.get("role") == "assistant" for m in trajectory.messages):
        return None
    return trajectory.messages


# ---- the chat template ----------------------------------------------------------------
def _template_checks(
    tokenizer: Any,
    kwargs: dict[str, Any],
    trajectory: Trajectory | None,
    tools: list[dict[str, Any]],
    parser: ToolCallParser | None,
    why_none: str,
) -> list[CheckResult]:
    """The template's rows: its kwargs, the rollout mode, and the turns' round trip."""
    from .engine import ChatRenderer, TemplateError
    from .engine._episode import probe_conversation

    rows = [_template_kwargs(tokenizer, kwargs)] if kwargs else []
    try:
        renderer = ChatRenderer(tokenizer, kwargs)
    except TemplateError as exc:
        return [*rows, CheckResult("chat template", False, str(exc))]
    played = trajectory is not None and any(t.text for t in trajectory.turns)
    if trajectory is not None and played:
        conversation, source = trajectory.messages, "the env's reference episode + a 2nd call"
        if trajectory.turns[0].text.startswith("<think>"):
            source += ", each turn opening with the <think> block the template expects"
    else:
        conversation = probe_conversation(tools)
        source = f"a generic two-call conversation ({why_none or 'no reference turns played'})"
    checks: list[Callable[[], CheckResult]] = [
        lambda: _rollout_mode(renderer, conversation, tools, source)
    ]
    if trajectory is not None and played and parser is not None:
        checks.append(lambda: _template_round_trip(renderer, trajectory, tools, parser))
    for run in checks:
        try:
            rows.append(run())
        except TemplateError as exc:  # the template refused the conversation: one row says so
            return [*rows, CheckResult("chat template", False, str(exc))]
    return rows


def _template_kwargs(tokenizer: Any, kwargs: dict[str, Any]) -> CheckResult:
    """Every chat-template kwarg must be a variable the template reads (typos do nothing)."""
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    if _template_variables(getattr(tokenizer, "chat_template", None)) is None:
        return CheckResult("chat template kwargs", True, f"{shown} (template not inspected)")
    problem = unread_template_kwargs(tokenizer, kwargs)
    if problem:
        return CheckResult("chat template kwargs", False, problem)
    return CheckResult("chat template kwargs", True, f"{shown}: read by the template")


def unread_template_kwargs(tokenizer: Any, kwargs: dict[str, Any]) -> str:
    """What is wrong with chat-template kwargs the template never reads; "" when none is.

    Such a kwarg changes nothing, silently (``enable_thinkng``); a template that cannot be
    inspected gets the benefit of the doubt.
    """
    read = _template_variables(getattr(tokenizer, "chat_template", None))
    unknown = [k for k in kwargs if read is not None and k not in read]
    if read is None or not unknown:
        return ""
    hints = [
        f"did you mean {close[0]!r} for {k!r}?"
        for k in unknown
        if (close := difflib.get_close_matches(k, read, n=1))
    ]
    return (
        f"the template never reads {', '.join(map(repr, unknown))}, so it changes nothing"
        f"{'; ' + ' '.join(hints) if hints else ''} (it reads: {', '.join(sorted(read))})"
    )


def _template_variables(template: Any) -> set[str] | None:
    """Names a jinja template reads from its context; None when it cannot be parsed."""
    if not isinstance(template, str):
        return None
    try:
        from jinja2 import Environment, meta

        return set(meta.find_undeclared_variables(Environment().parse(template)))
    except Exception:  # an extension tag (e.g. {% generation %}) or no jinja2: not inspected
        return None


def _rollout_mode(
    renderer: ChatRenderer, conversation: list[Message], tools: list[dict[str, Any]], source: str
) -> CheckResult:
    """The mode the engine gives this model and env, decided as the engine decides it."""
    decision = renderer.decide_mode(conversation, tools)
    detail = f"{decision.mode}: {decision.reason} (on {source})"
    if decision.mode == "per_turn":
        where = _first_rewrite(renderer, conversation, tools)
        detail += (f"; {where}" if where else "") + (
            "; every turn then trains as its own sample (Trajectory.mode='per_turn')"
        )
    return CheckResult("rollout mode", True, detail)


def _first_rewrite(
    renderer: ChatRenderer, conversation: list[Message], tools: list[dict[str, Any]]
) -> str:
    """Where consecutive renders stop extending each other, as the engine builds prompts.

    The engine needs each turn's prompt to be a prefix of the conversation once the turn is
    added, and that to be a prefix of the next turn's prompt. The first pair that is not is
    shown token-aligned (never from mid-token); "" when every pair extends as text.
    """
    ends = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    for k, end in enumerate(ends):
        prompt = _text(renderer, conversation[:end], tools, True)
        turn = _text(renderer, conversation[: end + 1], tools, False)
        if not turn.startswith(prompt):
            old, new = _token_aligned(renderer, prompt, turn)
            return (
                f"the prompt of assistant turn {k + 1} has {old!r} where, once the turn is "
                f"added, the template writes {new!r}"
            )
        if k + 1 < len(ends):
            following = _text(renderer, conversation[: ends[k + 1]], tools, True)
            if not following.startswith(turn):
                old, new = _token_aligned(renderer, turn, following)
                return (
                    f"assistant turn {k + 1} renders as {old!r} while it is the last message "
                    f"but as {new!r} once messages follow it"
                )
    return ""


def _text(
    renderer: ChatRenderer,
    messages: Sequence[Message],
    tools: list[dict[str, Any]],
    generation: bool,
) -> str:
    return renderer.render_text(messages, tools or None, generation=generation)


def _token_aligned(renderer: ChatRenderer, a: str, b: str, width: int = 32) -> tuple[str, str]:
    """``a`` and ``b`` from the first token where they differ, ``width`` characters of each.

    Starting at a token boundary shows whole markers (``<tool_call>``, not ``ool_call>``).
    """
    from .engine._render import first_difference

    ids_a, ids_b = renderer.encode(a), renderer.encode(b)
    at = first_difference(ids_a, ids_b)
    decode = renderer.tokenizer.decode
    return decode(ids_a[at : at + width])[:width], decode(ids_b[at : at + width])[:width]


def _template_round_trip(
    renderer: ChatRenderer,
    trajectory: Trajectory,
    tools: list[dict[str, Any]],
    parser: ToolCallParser,
) -> CheckResult:
    """The template must write each parsed assistant turn as the text the model produced.

    Otherwise a fresh render (``per_turn`` prompts, SFT data, a server) shows the model
    history it never wrote (text before a call dropped, JSON re-spaced, another format).
    """
    ends = [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"]
    for k, (end, turn) in enumerate(zip(ends, trajectory.turns, strict=False)):
        rendered = _rendered_turn(renderer, trajectory.messages[: end + 1], tools)
        if not rendered.startswith(turn.text):
            produced, written = _token_aligned(renderer, turn.text, rendered)
            return CheckResult(
                "chat template round trip",
                False,
                f"assistant turn {k + 1} was produced as {produced!r} but the template writes "
                f"{written!r}: {_blame(turn.text, rendered, parser)}",
            )
    return CheckResult(
        "chat template round trip", True, f"{len(ends)} assistant turns render as produced"
    )


def _rendered_turn(
    renderer: ChatRenderer, upto_turn: Sequence[Message], tools: list[dict[str, Any]]
) -> str:
    """How the template writes the last (assistant) message, without its turn end.

    The turn starts where its generation prompt ends, as the model samples it; if the render
    does not extend that prompt, where a render with a sentinel as the content diverges. The
    text the sentinel render has after the sentinel is the turn end.
    """
    full = _text(renderer, upto_turn, tools, False)
    probe = [*upto_turn[:-1], {"role": "assistant", "content": _SENTINEL}]
    marked = _text(renderer, probe, tools, False)
    at = marked.find(_SENTINEL)
    prompt = _text(renderer, upto_turn[:-1], tools, True)
    if full.startswith(prompt):  # the model samples right after its prompt
        start = len(prompt)
    else:  # the template rewrote the prompt (Mistral's system prompt): align on the sentinel
        start = at if at >= 0 else 0
        diverge = (i for i, (x, y) in enumerate(zip(full[:start], marked[:start])) if x != y)
        start = next(diverge, start)
    turn_end = marked[at + len(_SENTINEL) :] if at >= 0 else ""
    body = full[start:]
    return body[: len(body) - len(turn_end)] if turn_end and body.endswith(turn_end) else body


def _blame(produced: str, rendered: str, parser: ToolCallParser) -> str:
    """The most likely cause of a round-trip difference, with the fix."""
    ours = parser.parse(produced)
    if ours.content and ours.content not in rendered:
        return (
            f"the template drops the text before a tool call ({ours.content[:40]!r}); a fresh "
            "render loses it, so keep the concat mode's sampled tokens or prompt the model "
            "not to write text before calls"
        )

    def reads_back(reader: ToolCallParser) -> bool:
        turn = reader.parse(rendered)
        same_calls = [(c.name, c.arguments) for c in turn.tool_calls] == [
            (c.name, c.arguments) for c in ours.tool_calls
        ]
        return same_calls and turn.content == ours.content and not turn.errors

    if ours.tool_calls and not reads_back(parser):
        other = next((n for n in available_parsers() if reads_back(get_parser(n))), None)
        hint = f"; it reads as the {other!r} format (--env-arg parser={other})" if other else ""
        return f"the template writes tool calls the {parser.name!r} parser does not read{hint}"
    squeezed = "".join(produced.split())
    if "".join(rendered.split()).startswith(squeezed):
        return "only whitespace differs; make the parser's render match the template's spacing"
    return (
        "the template writes the same calls differently (JSON spacing, key order, ids or "
        "markup); make the parser's render match the template"
    )
