"""`MCPServer` specs, `MCPToolEnv` options and result rendering: the checks before anything runs."""

from __future__ import annotations

import sys

import pytest

from agentgym import ConfigError
from agentgym.mcp import MCPServer, MCPToolEnv


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"transport 'stdio' needs command=\.\.\."),
        ({"transport": "websocket", "url": "ws://x"}, "must be 'stdio' or 'http', got 'websocket'"),
        ({"command": "no-such-mcp-server-here"}, "'no-such-mcp-server-here' is not an executable"),
        ({"command": sys.executable, "url": "http://x/mcp"}, "got both command="),
        ({"transport": "http"}, r"needs url='http://HOST:PORT/mcp', got url=None"),
        ({"url": "127.0.0.1:8000/mcp", "transport": "http"}, "needs url='http://HOST:PORT/mcp'"),
        ({"command": sys.executable, "scope": "global"}, "scope must be 'episode' or 'shared'"),
        ({"command": sys.executable, "call_timeout": 0}, "call_timeout must be > 0 seconds"),
    ],
)
def test_a_bad_spec_is_a_config_error_naming_the_fix(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message) as excinfo:
        MCPServer(**kwargs)
    assert "\n" not in str(excinfo.value)


def test_the_transport_follows_from_command_or_url_and_equal_specs_are_one_server() -> None:
    assert MCPServer(command=sys.executable).transport == "stdio"
    assert MCPServer(url="http://127.0.0.1:1/mcp").transport == "http"
    a = MCPServer(command=sys.executable, args=["s.py"], env={"A": "1"}, prefix="x_")
    b = MCPServer(command=sys.executable, args=("s.py",), env={"A": "1"}, call_timeout=5)
    assert a.key() == b.key() and hash(a) == hash(b)  # same process, whatever the tool view
    assert a.key() != MCPServer(command=sys.executable, args=["t.py"]).key()


@pytest.mark.parametrize(
    ("servers", "kwargs", "message"),
    [
        ([], {}, r"needs servers=\[MCPServer"),
        (["python server.py"], {}, r"needs servers=\[MCPServer"),
        ([MCPServer(command=sys.executable)], {"tool_timeout": 5}, r"MCPServer\(call_timeout"),
    ],
)
def test_bad_env_options_are_config_errors_before_any_server_starts(
    servers, kwargs, message
) -> None:
    with pytest.raises(ConfigError, match=message):
        MCPToolEnv(servers, **kwargs)


def test_results_render_text_then_structured_content_then_placeholders() -> None:
    import mcp_types as types

    from agentgym.mcp._tools import result_text

    text = types.CallToolResult(
        content=[types.TextContent(text="a"), types.TextContent(text="b")],
        structured_content={"ignored": True},
    )
    assert result_text(text) == "a\nb"
    structured = types.CallToolResult(content=[], structured_content={"n": 2, "é": "ü"})
    assert result_text(structured) == '{"n": 2, "é": "ü"}'
    image = types.CallToolResult(content=[types.ImageContent(data="AAAA", mime_type="image/png")])
    assert result_text(image) == "[image content (image/png)]"
