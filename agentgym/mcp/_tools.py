"""MCP tools as agentgym `Tool`s, and MCP tool results as the text of a tool message."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agentgym._check import _TOOL_NAME  # the rule of `agentgym check`: one rule for names
from agentgym._errors import ConfigError
from agentgym._tools import Tool

from ._spec import MCPServer

if TYPE_CHECKING:
    import mcp_types

#: How an env runs one call: (the server's tool name, the model's arguments) -> message text.
CallTool = Callable[[str, dict[str, Any]], Awaitable[str]]


def as_tool(listed: mcp_types.Tool, spec: MCPServer, call: CallTool) -> Tool:
    """The agentgym `Tool` for one listed MCP tool, with the server's own input schema.

    The model sees exactly the schema the server lists, and the env validates arguments
    against it before the server gets them. The tool has no agentgym timeout: the server's
    ``call_timeout`` applies instead (a call that runs past it has the server restarted).
    """
    server_name = listed.name

    async def run(**arguments: Any) -> str:
        return await call(server_name, arguments)

    try:
        return Tool(
            fn=run,
            name=spec.prefix + server_name,
            description=listed.description or listed.title or "",
            parameters=dict(listed.input_schema),
            timeout=None,
            is_async=True,
        )
    except ConfigError as exc:  # its input schema is not one (the error says where)
        raise ConfigError(
            f"MCP server {spec.label!r} lists tool {server_name!r} with an invalid input "
            f"schema ({exc}); fix the server or leave the tool out with tools=[...]"
        ) from exc


def select(listed: list[mcp_types.Tool], spec: MCPServer) -> list[mcp_types.Tool]:
    """The listed tools ``spec.tools`` asks for (all when None), each checked (`_check_name`).

    An unknown name is an error.
    """
    by_name = {t.name: t for t in listed}
    if spec.tools is None:
        chosen = listed
    else:
        unknown = sorted(set(spec.tools) - set(by_name))
        if unknown:
            raise ConfigError(
                f"MCP server {spec.label!r} has no tool(s) {unknown}; it lists {sorted(by_name)}"
            )
        chosen = [by_name[name] for name in spec.tools]
    listings = Counter(t.name for t in listed)
    for tool in chosen:
        _check_name(tool.name, listings[tool.name], spec)
    return chosen


def _check_name(name: str, listings: int, spec: MCPServer) -> None:
    """Refuse a tool name the server lists ``listings`` > 1 times, or one models refuse.

    The name (after ``spec.prefix``) must be one `agentgym check` accepts, the rule of the
    models' APIs that the prefix is checked against too: a name with a dot, a space or markup
    went into the schemas, where the API refused it or it broke the tool-call text.
    """
    if listings > 1:  # a prefix renames both alike: only the server can tell them apart
        raise ConfigError(
            f"MCP server {spec.label!r} lists a tool named {name!r} {listings} times; fix the "
            "server (a prefix does not help: it renames every copy alike)"
        )
    full = spec.prefix + name
    if not _TOOL_NAME.match(full):
        fix = (
            "give a shorter prefix" if _TOOL_NAME.match(name)
            else "leave it out with MCPServer(tools=[...]) or fix the server"
        )  # fmt: skip
        raise ConfigError(
            f"MCP server {spec.label!r} lists tool {name!r}, and {full!r} is not a tool name "
            f"models accept (it must match {_TOOL_NAME.pattern}); {fix}"
        )


def result_text(result: mcp_types.CallToolResult) -> str:
    """The tool message for an MCP result: its text blocks, else its structured content.

    Servers that return structured content usually repeat it as text (the SDK's servers do),
    so text wins; structured content alone is written as JSON. Images, audio and binary
    resources cannot go into a text message: a placeholder names them.
    """
    parts = [_block_text(block) for block in result.content]
    if result.structured_content is not None and not any(b.type == "text" for b in result.content):
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


def _block_text(block: Any) -> str:
    if block.type == "text":
        return str(block.text)
    if block.type == "resource":
        text = getattr(block.resource, "text", None)
        return str(text) if text is not None else f"[binary resource {block.resource.uri}]"
    if block.type == "resource_link":
        return f"[resource {block.uri}]"
    return f"[{block.type} content ({getattr(block, 'mime_type', 'unknown type')})]"
