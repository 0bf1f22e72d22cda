"""An MCP server of ours: the key-value notes store that `agentgym/MCP-v0` plays by default.

It is written with the MCP SDK's ``MCPServer`` (FastMCP) in `agentgym.envs.mcp.notes_server`;
this script serves it, so any MCP client (or an `agentgym.mcp.MCPToolEnv`) can use it::

    python examples/mcp_server.py              # over stdio
    python examples/mcp_server.py --http 8765  # streamable HTTP at http://127.0.0.1:8765/mcp

and from Python::

    from agentgym.mcp import MCPServer, MCPToolEnv

    stdio = MCPServer(command=sys.executable, args=["examples/mcp_server.py"])
    http = MCPServer(url="http://127.0.0.1:8765/mcp")
"""

from agentgym.envs.mcp import main

if __name__ == "__main__":
    main()
