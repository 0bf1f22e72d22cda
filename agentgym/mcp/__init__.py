"""MCP servers as tools of a `ToolEnv`, on the official ``mcp`` Python SDK.

Any MCP server, over stdio (a command this process starts) or streamable HTTP (a URL),
becomes the tools of an `MCPToolEnv`: the model sees each tool with the server's own JSON
schema, and its results come back as tool messages. A call that crashes or hangs its server
is the model's doing while the server, started afresh, works (an episode's own server: the
episode is forfeited, reward 0); a server that cannot start is ``infra_error``. Each
`MCPServer` says whether an episode gets a server process of its own (``scope="episode"``)
or shares one (``scope="shared"``). Needs the ``tools`` extra (``pip install
'agentgym[tools]'``); importing this package does not import the SDK.

Example::

    from agentgym.mcp import MCPServer, MCPToolEnv

    env = MCPToolEnv(
        [MCPServer(command=".venv/bin/mcp-server-time", scope="shared")],
        tasks=[{"prompt": "What time is it in Lima?"}],
    )
"""

from ._connection import MCPServerError, close_shared_servers
from ._env import MCPToolEnv
from ._spec import MCPServer

__all__ = ["MCPServer", "MCPServerError", "MCPToolEnv", "close_shared_servers"]
