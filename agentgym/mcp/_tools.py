"""MCP tools as agentgym `Tool`s, and MCP tool results as the text of a tool message."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

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
    """The listed tools ``spec.tools`` asks for (all when None); an unknown name is an error."""
    if spec.tools is None:
        return listed
    by_name = {t.name: t for t in listed}
    unknown = sorted(set(spec.tools) - set(by_name))
    if unknown:
        raise ConfigError(
            f"MCP server {spec.label!r} has no tool(s) {unknown}; it lists {sorted(by_name)}"
        )
    return [by_name[name] for name in spec.tools]


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
