"""Pre-flight checks for an env (and optionally a model's tokenizer) before any training.

Each check is a small named function returning a `CheckResult`; `check` runs them all and
never raises for a failed check, so a user sees every problem at once instead of an
assertion failure an hour into training.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gymnasium.utils.env_checker import check_env

from ._env import Env
from ._errors import ConfigError
from ._policies import ScriptedPolicy
from ._registry import make
from ._rollout import EpisodeSpec, run_episode
from ._tools import example_arguments
from ._trajectory import Trajectory
from .parsers import ToolCall

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass
class CheckResult:
    """One named check: passed or not, and what it found."""

    name: str
    passed: bool
    detail: str = ""


def check(env_id: str, tokenizer: Any = None, **env_kwargs: Any) -> list[CheckResult]:
    """Run every pre-flight check on a registered env; ``tokenizer`` is a path or tokenizer."""
    make(env_id, **env_kwargs).close()  # unknown ids and bad kwargs fail here, loudly
    # both the reference check and the template checks read one played episode
    reference = functools.cache(lambda: _play_reference(env_id, env_kwargs))
    checks: list[Callable[[], CheckResult | list[CheckResult]]] = [
        lambda: _gymnasium_api(env_id, env_kwargs),
        lambda: _tool_schemas(make(env_id, **env_kwargs)),
        lambda: _parser_round_trip(make(env_id, **env_kwargs)),
        lambda: _reference_episode(*reference()),
    ]
    if tokenizer is not None:
        checks.append(lambda: _template_checks(tokenizer, *reference()))
    results: list[CheckResult] = []
    for run in checks:
        try:
            outcome = run()
            results.extend(outcome if isinstance(outcome, list) else [outcome])
        except Exception as exc:  # a crashing check is a failed check, not a crashed command
            results.append(CheckResult("check crashed", False, f"{type(exc).__name__}: {exc}"))
    return results


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
    problems = []
    schemas = getattr(env, "tool_schemas", [])
    for schema in schemas:
        fn = schema.get("function", {})
        if not _TOOL_NAME.match(fn.get("name", "")):
            problems.append(f"tool name {fn.get('name')!r} must match {_TOOL_NAME.pattern}")
        if not fn.get("description"):
            problems.append(f"tool {fn.get('name')!r} has no description (write a docstring)")
    env.close()
    detail = "; ".join(problems) or f"{len(schemas)} tool(s) valid"
    return CheckResult("tool schemas", not problems, detail)


def _parser_round_trip(env: Env) -> CheckResult:
    parser = getattr(env, "parser", None)
    if parser is None:
        return CheckResult("parser round trip", True, "env has no tool-call parser")
    calls = [
        ToolCall(t.name, example_arguments(t.parameters))
        for t in getattr(env, "tools", {}).values()
    ]
    env.close()
    parsed = parser.parse(parser.render("Let me check.", calls))
    got = [(c.name, c.arguments) for c in parsed.tool_calls]
    want = [(c.name, c.arguments) for c in calls]
    ok = got == want and not parsed.errors
    return CheckResult(
        f"parser round trip ({parser.name})",
        ok,
        "ok" if ok else f"rendered {want}, parsed {got} {parsed.errors}",
    )


def _play_reference(env_id: str, env_kwargs: dict[str, Any]) -> tuple[Trajectory | None, list]:
    """Play task 0 with the env's reference turns; None when the env has no reference."""
    env = make(env_id, **env_kwargs)
    reference = getattr(env, "reference_turns", None)
    tasks: Sequence[Any] = getattr(env, "tasks", ())
    task = tasks[0] if len(tasks) else None
    tools = getattr(env, "tool_schemas", [])
    env.close()
    if reference is None or task is None or reference(task) is None:
        return None, tools
    trajectory = asyncio.run(
        run_episode(
            lambda: make(env_id, **env_kwargs), ScriptedPolicy(reference), EpisodeSpec(0, 0, 0, 0)
        )
    )
    return trajectory, tools


def _reference_episode(trajectory: Trajectory | None, tools: list[Any]) -> CheckResult:
    if trajectory is None:
        return CheckResult("reference episode", True, "env has no reference solution")
    ok = trajectory.status in ("ok", "truncated") and (trajectory.final_reward or 0) > 0
    detail = f"status {trajectory.status}, reward {trajectory.final_reward}"
    return CheckResult(
        "reference episode", ok, detail + (f"\n{trajectory.error}" if trajectory.error else "")
    )


def _template_checks(
    tokenizer: Any, trajectory: Trajectory | None, tools: list[Any]
) -> list[CheckResult]:
    """Render the reference episode with the model's chat template, two ways."""
    tok = _load_tokenizer(tokenizer)
    if trajectory is None:
        return [CheckResult("chat template", True, "no reference episode to render")]
    messages = [_for_template(m) for m in trajectory.messages]

    def render(upto: int, generation: bool) -> list[int]:
        encoded = tok.apply_chat_template(
            messages[:upto], tools=tools or None, add_generation_prompt=generation
        )
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    ends = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    texts = [turn.text for turn in trajectory.turns]
    return [_prefix_check(tok, render, ends), _round_trip_check(tok, render, ends, texts)]


def _prefix_check(
    tok: Any, render: Callable[[int, bool], list[int]], ends: list[int]
) -> CheckResult:
    """Earlier turns must stay an exact token prefix of later prompts (token-in/token-out)."""
    for k in range(len(ends) - 1):
        history, prompt = render(ends[k] + 1, False), render(ends[k + 1], True)
        if prompt[: len(history)] != history:
            at = _first_difference(history, prompt)
            return CheckResult(
                "chat template prefix",
                False,
                f"turn {k + 1}'s prompt rewrites history at token {at}: "
                f"{tok.decode(history[at : at + 12])!r} became "
                f"{tok.decode(prompt[at : at + 12])!r}; "
                "train on per-turn samples or fix the template",
            )
    return CheckResult(
        "chat template prefix", True, f"{len(ends)} assistant turns keep their tokens"
    )


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Index of the first position where ``a`` and ``b`` differ (the shorter length if none)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _round_trip_check(
    tok: Any, render: Callable[[int, bool], list[int]], ends: list[int], texts: list[str]
) -> CheckResult:
    """The template must render each parsed assistant turn as the text the model produced.

    Otherwise the history a model is trained on differs from what it sampled (whitespace
    around tool calls, JSON spacing, reordered keys), a classic silent training bug.
    """
    for k, (end, text) in enumerate(zip(ends, texts)):
        prompt, full = render(end, True), render(end + 1, False)
        rendered = tok.decode(full[len(prompt) :]) if full[: len(prompt)] == prompt else ""
        if not rendered.startswith(text):
            at = _first_difference(text, rendered)
            return CheckResult(
                "chat template round trip",
                False,
                f"turn {k + 1} was produced as {text[at : at + 30]!r} but the template renders "
                f"{rendered[at : at + 30]!r} (at character {at}); make the parser's render match "
                "the template, or train on what was sampled",
            )
    return CheckResult(
        "chat template round trip", True, f"{len(ends)} assistant turns render as produced"
    )


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    """HF chat templates want tool-call arguments as dicts, not JSON strings."""
    if not message.get("tool_calls"):
        return message
    calls = [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


def _load_tokenizer(tokenizer: Any) -> Any:
    if not isinstance(tokenizer, str):
        return tokenizer
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConfigError(
            "checking a tokenizer needs transformers: pip install 'agentgym[train]'"
        ) from exc
    return AutoTokenizer.from_pretrained(tokenizer)
