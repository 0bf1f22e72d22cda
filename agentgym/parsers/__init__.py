"""Tool-call parsers, keyed by name: ``get_parser("hermes")``, ``get_parser("vllm:mistral")``."""

from . import hermes as _hermes  # noqa: F401  (registers itself)
from . import llama3_json as _llama3_json  # noqa: F401
from . import mistral as _mistral  # noqa: F401
from . import pythonic as _pythonic  # noqa: F401
from ._base import (
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    available_parsers,
    get_parser,
    register_parser,
)

__all__ = [
    "ParsedTurn",
    "ToolCall",
    "ToolCallParser",
    "available_parsers",
    "get_parser",
    "register_parser",
]
