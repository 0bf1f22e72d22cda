"""The parser contract and its registry.

A parser turns the model's raw assistant text into content + tool calls, and renders tool
calls back into the exact text format the model was trained on (the round trip that
`agentgym check` tests and that scripted/reference policies rely on).
"""

from __future__ import annotations

import difflib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError
from .._json import dumps, loads

#: The deepest nesting of JSON lists and objects (or pythonic literals) a call may hold. Deeper
#: is a parse error: decoding it would otherwise succeed or hit RecursionError depending on how
#: deep in the stack `parse` runs, and 100k of ``[`` would raise instead of being reported.
MAX_DEPTH = 100
#: The keys tool-call formats hold a call's arguments under (hermes and Mistral read
#: ``"arguments"``, Llama 3 JSON both, its own ``"parameters"`` first).
ARGUMENT_KEYS = ("parameters", "arguments")
_DECODER = json.JSONDecoder()


def _check_depth(value: Any, text: str, start: int, end: int) -> None:
    """Raise ValueError when ``value`` (decoded from ``text[start:end]``) nests too deep."""
    if end - start <= MAX_DEPTH or (
        text.count("[", start, end) + text.count("{", start, end) <= MAX_DEPTH
    ):
        return  # too short, or too few brackets, to nest that deep: no walk (the usual call)
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def json_loads(text: str) -> Any:
    """`json.loads` for model text: every failure is a ValueError, never RecursionError.

    Nesting deeper than `MAX_DEPTH` is a ValueError too.
    """
    try:
        value = loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    _check_depth(value, text, 0, len(text))
    return value


def json_raw_decode(text: str, pos: int = 0) -> tuple[Any, int]:
    """`json.JSONDecoder.raw_decode` with `json_loads`'s guarantees (ValueError only)."""
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    _check_depth(value, text, pos, end)
    return value, end


class ForwardFinder:
    """``text.find(needle, pos)`` for growing ``pos``, scanning each stretch of text once.

    Why: a turn of many calls (or many cut-off calls) would otherwise search the rest of the
    text again for every call, quadratic in the turn (2.3 s on 100 KB).
    """

    def __init__(self, text: str, needle: str) -> None:
        self.text, self.needle, self.asked, self.found = text, needle, len(text) + 1, -1

    def find(self, pos: int) -> int:
        if not (self.asked <= pos and (self.found < 0 or self.found >= pos)):
            self.found = self.text.find(self.needle, pos)
        self.asked = pos
        return self.found


def skip_space(text: str, pos: int) -> int:
    """The first position at or after ``pos`` that is not whitespace (``len(text)`` if none)."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


@dataclass
class ToolCall:
    """One function call the model asked for; ``arguments`` is already decoded JSON."""

    name: str
    arguments: dict[str, Any]
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry (arguments as a JSON string, as the API sends them)."""
        return {
            "id": self.id,
            "type": "function",
            # the model's characters kept (Zürich, not Z\u00fcrich), as vLLM's parsers keep them
            "function": {"name": self.name, "arguments": dumps(self.arguments)},
        }


@dataclass
class ParsedTurn:
    """What a parser found in one assistant turn.

    ``errors`` lists the tool-call snippets that looked like calls but could not be parsed,
    each with the reason; the env reports them back to the model instead of failing.
    """

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def call_from_json(obj: Any, argument_keys: tuple[str, ...] = ("arguments",)) -> ToolCall:
    """One decoded ``{"name": ..., "arguments": ...}`` object as a `ToolCall`.

    ``argument_keys`` are the keys the format reads the arguments from, which may be a JSON
    object, a string holding one, or missing/null (no arguments). Raises `TypeError` or
    `ValueError` (invalid JSON in a string) with the reason, for the parser's ``errors``.

    Arguments under a key the format does not read (``"parameters"`` in a hermes call, the
    Llama and OpenAI-schema spelling) are an error naming the key it reads, and so are two
    keys it reads holding different values. Why: read as "no arguments", the call ran with
    ``{}`` and the model was told that an argument it wrote was missing (or, for a tool whose
    parameters all have defaults, the call silently ran with none of them).
    """
    if not isinstance(obj, dict):
        raise TypeError("a call must be a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise TypeError("'name' must be a non-empty string")
    present = [k for k in argument_keys if k in obj]
    if not present:
        stray = next((k for k in ARGUMENT_KEYS if k in obj), None)
        if stray is not None:
            raise TypeError(
                f"{stray!r} is not read in this format; put the arguments under "
                f"{argument_keys[0]!r}"
            )
    elif any(obj[k] != obj[present[0]] for k in present[1:]):
        raise TypeError(
            f"both {present[0]!r} and {present[1]!r} hold arguments, with different values; "
            "give one of them"
        )
    key = present[0] if present else argument_keys[0]
    arguments = obj.get(key)
    if arguments is None:
        arguments = {}
    elif isinstance(arguments, str):
        arguments = json_loads(arguments)
    if not isinstance(arguments, dict):
        raise TypeError(f"{key!r} must be a JSON object")
    return ToolCall(name=name, arguments=arguments)


def marker_without_call(turn: ParsedTurn, marker: str) -> ParsedTurn:
    """``turn``, with an error when the ``marker`` opening its calls has no call after it.

    Why: a turn cut right after the marker (``[TOOL_CALLS]`` and nothing more) read as a
    final answer with no call, so the episode ended on it; as an error, the model is told.
    """
    if not (turn.tool_calls or turn.errors):
        turn.errors.append(f"{marker} with no call after it")
    return turn


def refuse_call_start(parser: str, content: str, call_start: re.Pattern[str]) -> None:
    """Raise `ValueError` when ``content`` holds text that `parse` reads as a call's start.

    Content is free text that the formats have no escape for, so such a turn cannot be
    rendered in a way that parses back; refusing keeps `render`'s round-trip promise.
    """
    found = call_start.search(content)
    if found:
        raise ValueError(
            f"{parser} cannot render content containing {content[found.start() :][:40]!r}: "
            "it would parse as a tool call"
        )


class ToolCallParser(ABC):
    """Base class of tool-call parsers; subclasses register with `register_parser`."""

    #: Registry key, e.g. ``"hermes"``.
    name: str = ""

    @abstractmethod
    def parse(self, text: str) -> ParsedTurn:
        """Split ``text`` into content and tool calls; never raises on malformed calls."""

    @abstractmethod
    def render(self, content: str, tool_calls: list[ToolCall]) -> str:
        """Text the model would emit for ``content`` followed by ``tool_calls``.

        `parse` reads it back to the same (stripped) content, names and arguments, or this
        raises `ValueError` for what the format cannot express.
        """

    def make_call_id(self, turn: int, index: int) -> str:
        """The id the env gives call ``index`` of assistant turn ``turn`` when the model wrote none.

        Chat templates render these ids back into the prompt, and some check their shape
        (Mistral's require 9 alphanumerics), so the format the model was trained on decides;
        this default suits templates that take any string.
        """
        return f"call_{turn}_{index}"

    def for_tools(self, tools: list[dict[str, Any]]) -> ToolCallParser:
        """The parser to use for an env with these OpenAI tool schemas (the env calls it once).

        Formats that write argument values without JSON types (Qwen3-Coder's XML) read the
        schemas to tell the string ``"42"`` from the number 42; others ignore them.
        """
        return self


_PARSERS: dict[str, Callable[..., ToolCallParser]] = {}


def register_parser(name: str) -> Callable[[type[ToolCallParser]], type[ToolCallParser]]:
    """Class decorator adding a parser to the registry under ``name``."""

    def decorate(cls: type[ToolCallParser]) -> type[ToolCallParser]:
        cls.name = name
        _PARSERS[name] = cls
        return cls

    return decorate


def get_parser(name: str | ToolCallParser, **kwargs: Any) -> ToolCallParser:
    """Look up a parser by name; ``vllm:<name>`` adapts one of vLLM's parsers.

    Raises:
        ConfigError: the name is unknown; the message lists the known ones.
    """
    if isinstance(name, ToolCallParser):
        return name
    if name.startswith("vllm:"):
        from .vllm_adapter import VLLMToolParser

        return VLLMToolParser(name.removeprefix("vllm:"), **kwargs)
    if name not in _PARSERS:
        close = difflib.get_close_matches(name, _PARSERS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"unknown tool-call parser {name!r}.{hint} Known: {', '.join(sorted(_PARSERS))}, "
            "or 'vllm:<name>' for any of vLLM's parsers"
        )
    return _PARSERS[name](**kwargs)


def available_parsers() -> list[str]:
    """Names accepted by `get_parser` (besides the ``vllm:`` prefix)."""
    return sorted(_PARSERS)
