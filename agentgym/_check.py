"""Pre-flight checks for an env (and optionally a model's tokenizer) before any training.

Each check is a small named function returning a `CheckResult`; `check` runs them all and
never raises for a failed check, so a user sees every problem at once instead of an
assertion failure an hour into training.
"""

from __future__ import annotations

import asyncio
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
    checks: list[Callable[[], CheckResult]] = [
        lambda: _gymnasium_api(env_id, env_kwargs),
        lambda: _tool_schemas(make(env_id, **env_kwargs)),
        lambda: _parser_round_trip(make(env_id, **env_kwargs)),
        lambda: _reference_episode(env_id, env_kwargs),
    ]
    if tokenizer is not None:
        checks.append(lambda: _template_prefix(env_id, env_kwargs, tokenizer))
    results = []
    for run in checks:
        try:
            results.append(run())
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


def _reference_episode(env_id: str, env_kwargs: dict[str, Any]) -> CheckResult:
    trajectory, _ = _play_reference(env_id, env_kwargs)
    if trajectory is None:
        return CheckResult("reference episode", True, "env has no reference solution")
    ok = trajectory.status in ("ok", "truncated") and (trajectory.final_reward or 0) > 0
    detail = f"status {trajectory.status}, reward {trajectory.final_reward}"
    return CheckResult(
        "reference episode", ok, detail + (f"\n{trajectory.error}" if trajectory.error else "")
    )


def _template_prefix(env_id: str, env_kwargs: dict[str, Any], tokenizer: Any) -> CheckResult:
    """Earlier turns must stay an exact token prefix of later prompts (token-in/token-out)."""
    tok = _load_tokenizer(tokenizer)
    trajectory, tools = _play_reference(env_id, env_kwargs)
    if trajectory is None:
        return CheckResult("chat template prefix", True, "no reference episode to render")
    messages = [_for_template(m) for m in trajectory.messages]
    ends = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for k in range(len(ends) - 1):
        history = _ids(tok.apply_chat_template(messages[: ends[k] + 1], tools=tools or None))
        prompt = _ids(
            tok.apply_chat_template(
                messages[: ends[k + 1]], tools=tools or None, add_generation_prompt=True
            )
        )
        if prompt[: len(history)] != history:
            at = next((i for i, (a, b) in enumerate(zip(history, prompt)) if a != b), len(prompt))
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


def _ids(encoded: Any) -> list[int]:
    return list(
        encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded
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
