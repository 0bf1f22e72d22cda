"""Tool-call parsers, keyed by name: ``get_parser("hermes")``, ``get_parser("vllm:mistral")``."""

from . import deepseek_v3 as _deepseek_v3  # noqa: F401  (registers itself)
from . import hermes as _hermes  # noqa: F401
from . import llama3_json as _llama3_json  # noqa: F401
from . import mistral as _mistral  # noqa: F401
from . import pythonic as _pythonic  # noqa: F401
from . import qwen3_coder as _qwen3_coder  # noqa: F401
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
