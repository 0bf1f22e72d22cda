"""The chat-template rows of `agentgym check --model`: kwargs, rollout mode, round trip.

The template is exercised exactly as the rollout engine uses it (`agentgym.engine.ChatRenderer`)
on a played episode: the ``rollout mode`` row says whether episodes train as one sequence
(``concat``) or one sample per turn (``per_turn``) and why; the round-trip row says whether
the template writes each assistant turn as the model produced it, and if not, which cause.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._check_result import CheckResult
from ._errors import ConfigError
from ._tool_env import without_reasoning
from ._tool_schema import example_arguments
from ._trajectory import Trajectory
from ._types import Message
from .parsers import ParsedTurn, ToolCallParser, available_parsers, get_parser

if TYPE_CHECKING:
    from .engine import ChatRenderer

#: The reasoning of each exercise turn when the model thinks (no digits: answers stay right).
REASONING = "The tool gives the exact result, so I use it."
#: Marks where an assistant turn's content starts in a render; no template rewrites it.
_SENTINEL = "\u2063agentgym-content\u2063"


def reasoning_prefix(tokenizer: Any, kwargs: dict[str, Any], tools: list[dict[str, Any]]) -> str:
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


def template_checks(
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
            detail = template_failure_cause(renderer, tools, parser) or str(exc)
            return [*rows, CheckResult("chat template", False, detail)]
    return rows


def template_failure_cause(
    renderer: ChatRenderer, tools: list[dict[str, Any]], parser: ToolCallParser | None
) -> str:
    """The env's parser, when it is why the template failed (ids Mistral's cannot render).

    "" when the template writes the parser's call: it failed on something else (a role it
    refuses), which its own message says.
    """
    from .engine import TemplateError

    if not tools or parser is None:
        return ""
    try:
        expected = _probe_call(tools)
        _written_call(renderer, tools, parser, expected[0])
    except TemplateError as exc:
        return _unwritable_call(renderer, tools, parser, expected, exc)
    except ConfigError:  # the template fails on any call: its own message says why
        pass
    return ""


def _template_kwargs(tokenizer: Any, kwargs: dict[str, Any]) -> CheckResult:
    """Every chat-template kwarg must be a variable the template reads (typos do nothing)."""
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    problem = unread_template_kwargs(tokenizer, kwargs)  # a quoted boolean fails uninspected too
    if problem:
        return CheckResult("chat template kwargs", False, problem)
    if _template_variables(getattr(tokenizer, "chat_template", None)) is None:
        return CheckResult("chat template kwargs", True, f"{shown} (template not inspected)")
    return CheckResult("chat template kwargs", True, f"{shown}: read by the template")


def unread_template_kwargs(tokenizer: Any, kwargs: dict[str, Any]) -> str:
    """What is wrong with chat-template kwargs the template never reads; "" when none is.

    Such a kwarg changes nothing, silently (``enable_thinkng``); a template that cannot be
    inspected gets the benefit of the doubt. A boolean quoted as a string
    (``"enable_thinking": "false"``) is refused too (`_quoted_booleans`), inspected or not.
    Each message ends with its own fix, so callers add none.
    """
    quoted = _quoted_booleans(kwargs)
    if quoted:
        return quoted
    read = _template_variables(getattr(tokenizer, "chat_template", None))
    unknown = [k for k in kwargs if read is not None and k not in read]
    if read is None or not unknown:
        return ""
    hints = [
        f"did you mean {close[0]!r} for {k!r}?"
        for k in unknown
        if (close := difflib.get_close_matches(k, read, n=1))
    ]
    fix = "drop it or fix its name" if len(unknown) == 1 else "drop them or fix their names"
    return (
        f"the template never reads {', '.join(map(repr, unknown))}, so it changes nothing"
        f"{'; ' + ' '.join(hints) if hints else ''} (it reads: {', '.join(sorted(read))}); {fix}"
    )


def _quoted_booleans(kwargs: dict[str, Any]) -> str:
    """What is wrong with kwargs whose value is a boolean's spelling as a string; "" if none.

    Why: ``{"enable_thinking": "false"}`` (JSON quoting, or a quoted YAML value) passed the
    check, yet a template tests ``enable_thinking is false`` (Qwen3's) or ``if
    enable_thinking``, and the string is neither false nor falsy: thinking stayed on.
    """
    quoted = {
        k: v
        for k, v in kwargs.items()
        if isinstance(v, str) and v.strip().lower() in ("true", "false")
    }
    if not quoted:
        return ""
    shown = ", ".join(f"{k}={v!r}" for k, v in quoted.items())
    fixed = ", ".join(f'"{k}": {v.strip().lower()}' for k, v in quoted.items())
    return (
        f"{shown} is a string, which the template does not read as a boolean (a non-empty "
        f"string is true); pass the JSON boolean: '{{{fixed}}}' (in Python, "
        f"{', '.join(f'{k}={v.strip().capitalize()}' for k, v in quoted.items())})"
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
    Dropped text alone is a warning, not a failure: it is how the family's own template
    (Llama 3.1's, Mistral's) writes history, the ``concat`` mode keeps the sampled tokens, and
    ``per_turn`` samples train on the prompt the model was given.
    """
    ends = [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"]
    for k, (end, turn) in enumerate(zip(ends, trajectory.turns, strict=False)):
        rendered = renderer.written_turn_text(trajectory.messages[: end + 1], tools or None)
        if not rendered.startswith(turn.text):
            produced, written = _token_aligned(renderer, turn.text, rendered)
            dropped = _dropped_text(turn.text, rendered, parser)
            blame = _dropped_blame(dropped) if dropped else _blame(turn.text, rendered, parser)
            return CheckResult(
                "chat template round trip",
                bool(dropped),
                f"assistant turn {k + 1} was produced as {produced!r} but the template writes "
                f"{written!r}: {blame}",
                warning=bool(dropped),
            )
    return CheckResult(
        "chat template round trip", True, f"{len(ends)} assistant turns render as produced"
    )


def _dropped_text(produced: str, rendered: str, parser: ToolCallParser) -> str:
    """The text before a call that the template leaves out of its render ("" if none is)."""
    ours = parser.parse(produced)
    return ours.content if ours.tool_calls and ours.content not in rendered else ""


def _dropped_blame(dropped: str) -> str:
    return (
        f"the template drops the text before a tool call ({dropped[:40]!r}); a fresh "
        "render loses it, so keep the concat mode's sampled tokens or prompt the model "
        "not to write text before calls"
    )


def _blame(produced: str, rendered: str, parser: ToolCallParser) -> str:
    """The most likely cause of a round-trip difference other than dropped text, with the fix."""
    ours = parser.parse(produced)

    def reads_back(reader: ToolCallParser) -> bool:
        turn = reader.parse(rendered)
        same_calls = [(c.name, c.arguments) for c in turn.tool_calls] == [
            (c.name, c.arguments) for c in ours.tool_calls
        ]
        return same_calls and turn.content == ours.content and not turn.errors

    if ours.tool_calls and not any(c.name in rendered for c in ours.tool_calls):
        return DROPS_CALLS
    if ours.tool_calls and not reads_back(parser):
        other = next((n for n in available_parsers() if reads_back(get_parser(n))), None)
        blame = f"the template writes tool calls the {parser.name!r} parser does not read"
        if other:
            blame += f"; it reads as the {other!r} format ({env_option('parser', other)})"
        return blame
    squeezed = "".join(produced.split())
    if "".join(rendered.split()).startswith(squeezed):
        return "only whitespace differs; make the parser's render match the template's spacing"
    lost = _lost_by_parser(produced, rendered, ours, parser) if ours.tool_calls else ""
    if lost:
        return _lost_blame(lost, produced, ours, parser)
    writer = _parser_writing_as(rendered, ours, parser) if ours.tool_calls else None
    if writer:
        return (
            f"the template writes the same calls as the {writer!r} parser does, not as "
            f"{parser.name!r} (both read them): use {env_option('parser', writer)}, so "
            "the env's reference turns and SFT traces are what the template writes"
        )
    return (
        "the template writes the same calls differently (JSON spacing, key order, ids or "
        "markup); make the parser's render match the template"
    )


def _lost_by_parser(produced: str, rendered: str, ours: ParsedTurn, parser: ToolCallParser) -> str:
    """What ``parser`` lost reading ``produced``, when the template writes the turn it read.

    "" when the template writes something else, or when nothing was lost.
    """
    try:
        own = parser.render(ours.content, ours.tool_calls)
    except (ValueError, NotImplementedError, ConfigError):  # it cannot write what it read
        return ""
    if not rendered.startswith(own):
        return ""
    matcher = difflib.SequenceMatcher(None, produced, rendered, autojunk=False)
    return "".join(
        produced[i1:i2] for op, i1, i2, _, _ in matcher.get_opcodes() if op in ("delete", "replace")
    ).strip()


def _lost_blame(lost: str, produced: str, ours: ParsedTurn, parser: ToolCallParser) -> str:
    """Blame the parser for what it lost, naming a shipped parser that keeps it.

    vLLM's llama3_json parser drops the text before a call, so the turn the env keeps has
    none and the template writes the call alone; blaming the parser's format named a parser
    (``llama3_json``) that writes the same calls, as if the format were the difference.
    """
    calls = [(c.name, c.arguments) for c in ours.tool_calls]
    keepers = (n for n in available_parsers() if n != parser.name)
    keeper = next((n for n in keepers if _keeps(get_parser(n), produced, calls, lost)), None)
    fix = (
        f"use {env_option('parser', keeper)}, which keeps it"
        if keeper
        else "no shipped parser reads these calls and keeps it"
    )
    return (
        f"the {parser.name!r} parser drops {lost[:40]!r} when it reads the turn, and the "
        f"template writes the turn as the parser read it: {fix}"
    )


def _keeps(reader: ToolCallParser, produced: str, calls: list[Call], lost: str) -> bool:
    """Whether ``reader`` reads ``calls`` in ``produced`` and keeps the ``lost`` text."""
    turn = reader.parse(produced)
    same = [(c.name, c.arguments) for c in turn.tool_calls] == calls and not turn.errors
    return same and lost in turn.content


def _parser_writing_as(rendered: str, turn: ParsedTurn, parser: ToolCallParser) -> str | None:
    """A shipped parser whose render of ``turn`` is what the template wrote, or None.

    DeepSeek V3.1's template writes its short form, which ``deepseek_v3`` reads but does not
    write: ``deepseek_v31`` does.
    """
    for name in available_parsers():
        if name == parser.name:
            continue
        try:
            text = get_parser(name).render(turn.content, turn.tool_calls)
        except (ValueError, NotImplementedError, ConfigError):  # a format that cannot write it
            continue
        if rendered.startswith(text):
            return name
    return None


def env_option(name: str, value: str) -> str:
    """An env option as the commands take it: ``agentgym train`` has no ``--env-arg``."""
    return f"--env-arg {name}={value} (agentgym train: --set env_kwargs.{name}={value})"


#: A tool call as a parser reads it: (name, arguments).
Call = tuple[str, Any]


def read_calls(parser: ToolCallParser, text: str) -> list[Call] | None:
    """The calls ``parser`` reads in a reply as the env reads it; None on a parse error."""
    turn = parser.parse(without_reasoning(text))
    return None if turn.errors else [(c.name, c.arguments) for c in turn.tool_calls]


#: The fix for a template that writes no call at all: no parser can read what is not there.
DROPS_CALLS = (
    "the template drops the turn's tool calls (a fresh render shows the model none of the calls "
    "it made): give the model a chat template that writes tool calls (one made for tool use)"
)


def other_reader(text: str, expected: list[Call], parser: ToolCallParser) -> str | None:
    """The name of a shipped parser other than ``parser`` that reads ``expected`` in ``text``."""
    readers = (n for n in available_parsers() if n != parser.name)
    return next((n for n in readers if read_calls(get_parser(n), text) == expected), None)


def format_fix(text: str, expected: list[Call], parser: ToolCallParser) -> str:
    """The fix to name: the shipped parser that reads the template's calls, or the template."""
    if not any(name in text for name, _ in expected):
        return DROPS_CALLS
    other = other_reader(text, expected, parser)
    if other:
        return f"it reads as the {other!r} format: use {env_option('parser', other)}"
    return f"give the model a chat template that writes the {parser.name!r} format"


def shows_tools(renderer: ChatRenderer, tools: list[dict[str, Any]]) -> bool:
    """Whether the template's first prompt names the env's first tool (it renders ``tools``)."""
    probe = [{"role": "user", "content": "probe"}]
    return bool(tools) and tools[0]["function"]["name"] in renderer.render_text(
        probe, tools, generation=True
    )


def unshown_tools_problem(renderer: ChatRenderer, tools: list[dict[str, Any]]) -> str:
    """Why the model would never see the env's tools; "" when the template shows them.

    DeepSeek V3.1's template, for one, ignores ``tools``: its model would be asked to call
    tools it was never shown. The env can list them in its system prompt instead.
    """
    if not tools or shows_tools(renderer, tools):
        return ""
    return (
        f"the chat template does not render tools (the tool {tools[0]['function']['name']!r} "
        "is missing from the prompt), so the model never sees them; use a model whose "
        "template supports tools, or the env's tool_prompt='system', which lists them in its "
        f"system prompt: {env_option('tool_prompt', 'system')}"
    )


def call_format_problem(
    renderer: ChatRenderer, tools: list[dict[str, Any]], parser: ToolCallParser
) -> str:
    """Why the env's parser would not read calls in the template's format; "" when it would.

    Why it matters: a template that shows the tools also tells the model how to call them
    (Hermes' ``<tool_call>`` tags, Llama 3's bare JSON, Mistral's ``[TOOL_CALLS]``), and a
    pretrained model writes that format. Under another parser every call reads as plain text:
    a run whose rollouts never call a tool, with nothing said. One call to the env's first
    tool, with arguments its schema accepts and the id the parser gives, is rendered as a
    finished turn and read back.
    """
    from .engine import TemplateError

    expected = _probe_call(tools)
    try:
        text = _written_call(renderer, tools, parser, expected[0])
    except TemplateError as exc:
        return _unwritable_call(renderer, tools, parser, expected, exc)
    if read_calls(parser, text) == expected:
        return ""
    return (
        f"the chat template writes a call to {expected[0][0]!r} as {text[:80]!r}, which the "
        f"env's parser {parser.name!r} does not read, so the model would call no tool; "
        f"{format_fix(text, expected, parser)}"
    )


def _probe_call(tools: list[dict[str, Any]]) -> list[Call]:
    """One call to the env's first tool, with arguments its schema accepts."""
    function = tools[0]["function"]
    return [(function["name"], example_arguments(function.get("parameters") or {}))]


def _unwritable_call(
    renderer: ChatRenderer,
    tools: list[dict[str, Any]],
    parser: ToolCallParser,
    expected: list[Call],
    exc: Exception,
) -> str:
    """Why the template refused the parser's call, naming a shipped parser it writes, if any.

    Mistral's requires 9-character ids, which hermes' are not.
    """
    others = (get_parser(n) for n in available_parsers() if n != parser.name)
    fits = (p.name for p in others if _writes_readable_call(renderer, tools, p, expected))
    fix = next((f"use {env_option('parser', n)}" for n in fits), "")
    return (
        f"the chat template cannot write a call with the id {parser.make_call_id(1, 0)!r} "
        f"the env's parser {parser.name!r} gives ({exc.__cause__ or exc}); "
        f"{fix or f'give the model a chat template that writes the {parser.name!r} format'}"
    )


def _written_call(
    renderer: ChatRenderer, tools: list[dict[str, Any]], parser: ToolCallParser, call: Call
) -> str:
    """The template's text for an assistant turn that makes ``call``, with ``parser``'s id."""
    function = {"name": call[0], "arguments": call[1]}
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": parser.make_call_id(1, 0), "type": "function", "function": function}]}  # fmt: skip
    return renderer.written_turn_text([{"role": "user", "content": "probe"}, message], tools)


def _writes_readable_call(
    renderer: ChatRenderer,
    tools: list[dict[str, Any]],
    parser: ToolCallParser,
    expected: list[Call],
) -> bool:
    """Whether the template writes ``expected`` with ``parser``'s id so that it reads it back."""
    from .engine import TemplateError

    try:
        return read_calls(parser, _written_call(renderer, tools, parser, expected[0])) == expected
    except TemplateError:
        return False
