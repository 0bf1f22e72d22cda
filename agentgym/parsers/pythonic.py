"""Pythonic tool calls (Llama 3.2 / Llama 4 style): ``[get_weather(city="Paris"), now()]``.

The calls are a Python list of calls with keyword arguments whose values are literals (strings,
numbers, booleans, ``None``, lists, tuples, dicts; JSON's ``true``/``false``/``null`` too). The
text is parsed with `ast`, never evaluated. The list must run to the end of the text and start
the text or a line, or follow Llama 4's ``<|python_start|>`` token anywhere (a closing
``<|python_end|>`` is dropped, as vLLM's ``llama4_pythonic`` parser drops both); text before
it is the content.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
import unicodedata
from typing import Any

from ._base import (
    MAX_DEPTH,
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    marker_without_call,
    refuse_call_start,
    register_parser,
)

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
#: Where a call list may start: ``[`` then a (dotted) name and ``(``, at the text or a line
#: start; or Llama 4's ``<|python_start|>`` token.
_LIST_START = re.compile(
    rf"{re.escape(PYTHON_START)}|(?:^|\n)[ \t]*(?=\[\s*[A-Za-z_][\w.]*\s*\()"
)
_JSON_NAMES = {"true": True, "false": False, "null": None}
#: A tool name `render` writes: `_LIST_START` only reads names that open with an ASCII letter.
_NAME = re.compile(r"[A-Za-z_][\w.]*")


def _identifier(name: str) -> bool:
    """Whether ``name`` reads back as itself as a Python name.

    Python NFKC-normalizes names: ``ﬁ`` reads as ``fi``, ``µ`` as ``μ``.
    """
    return (
        name.isidentifier()
        and not keyword.iskeyword(name)
        and unicodedata.normalize("NFKC", name) == name
    )


def _literal(node: ast.expr, depth: int = 1) -> Any:
    """The JSON value of a literal node; ValueError for anything else (names, calls, ...)."""
    if depth > MAX_DEPTH:  # a fixed limit, not whatever recursion the stack has left
        raise ValueError(f"values nested deeper than {MAX_DEPTH} levels")
    if isinstance(node, ast.Constant) and (
        node.value is None or isinstance(node.value, (str, int, float))
    ):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
            raise ValueError("dict keys must be string literals")
        return {
            k.value: _literal(v, depth + 1)  # type: ignore[union-attr]
            for k, v in zip(node.keys, node.values, strict=True)
        }
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand, depth + 1)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    raise ValueError(f"argument values must be literals, got {ast.unparse(node)[:80]!r}")


def _dotted_name(node: ast.expr) -> str:
    """``a.b.c`` for a chain of attributes on a name; ValueError otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    raise ValueError(f"a call must name a function, got {ast.unparse(node)[:80]!r}")


def _call(node: ast.expr) -> ToolCall:
    """One element of the list as a call; ValueError when it is not a keyword-only call."""
    if not isinstance(node, ast.Call):
        raise ValueError(f"list items must be calls, got {ast.unparse(node)[:80]!r}")
    name = _dotted_name(node.func)
    if node.args or any(k.arg is None for k in node.keywords):
        raise ValueError(f"{name}(): only keyword arguments are supported")
    return ToolCall(name=name, arguments={k.arg: _literal(k.value) for k in node.keywords})  # type: ignore[misc]


def _python_literal(value: Any) -> str:
    """Python source of a JSON value (``True``/``None``, repr'd strings)."""
    if isinstance(value, dict):
        items = ", ".join(f"{_python_literal(k)}: {_python_literal(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_python_literal(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"cannot render {value!r}: Python has no literal for it")
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    raise ValueError(f"cannot render {type(value).__name__} as a literal: {value!r}")


@register_parser("pythonic")
class PythonicParser(ToolCallParser):
    """Parse and render pythonic tool calls (a Python list of keyword-argument calls)."""

    def parse(self, text: str) -> ParsedTurn:
        match = _LIST_START.search(text)
        if not match:
            return ParsedTurn(content=text)
        source = text[match.end() :].strip()
        turn = ParsedTurn(content=text[: match.start()].strip())
        if source.endswith(PYTHON_END):
            source = source[: -len(PYTHON_END)].rstrip()
        if not source:  # a turn cut right after <|python_start|>
            return marker_without_call(turn, PYTHON_START)
        try:
            tree = ast.parse(source, mode="eval").body
            if not isinstance(tree, ast.List):
                raise ValueError("expected a list of calls")
            calls = [_call(e) for e in tree.elts]
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            reason = exc.msg if isinstance(exc, SyntaxError) else str(exc) or type(exc).__name__
            turn.errors.append(f"malformed tool calls {source[:200]!r}: {reason}")
            return turn
        turn.tool_calls = calls
        return turn

    def render(self, content: str, tool_calls: list[ToolCall]) -> str:
        refuse_call_start(self.name, content, _LIST_START)
        if not tool_calls:
            return content
        rendered = []
        for call in tool_calls:
            if not _NAME.fullmatch(call.name) or not all(map(_identifier, call.name.split("."))):
                raise ValueError(f"tool name {call.name!r} is not a Python (dotted) identifier")
            bad = [k for k in call.arguments if not _identifier(k)]
            if bad:
                raise ValueError(f"argument names {bad} of {call.name!r} are not identifiers")
            args = ", ".join(f"{k}={_python_literal(v)}" for k, v in call.arguments.items())
            rendered.append(f"{call.name}({args})")
        calls = "[" + ", ".join(rendered) + "]"
        return f"{content}\n{calls}" if content else calls
