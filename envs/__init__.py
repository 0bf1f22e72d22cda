"""Built-in environments; each family registers itself with one `register` call here."""

from agentgym._registry import register


def register_builtin_envs() -> None:
    """Register the built-in envs in Gymnasium's registry (entry points import lazily)."""
    register("agentgym/Calculator-v0", "agentgym.envs.calculator:CalculatorEnv")
    register("agentgym/HumanEval-v0", "agentgym.envs.humaneval:HumanEvalEnv")
    register("agentgym/DocSearch-v0", "agentgym.envs.docsearch:DocSearchEnv")
    register("agentgym/Search-v0", "agentgym.envs.search:SearchEnv")
    register("agentgym/PythonCode-v0", "agentgym.envs.pythoncode:PythonCodeEnv")
    register("agentgym/MCP-v0", "agentgym.envs.mcp:MCPEnv")
    register("agentgym/ToolAPI-v0", "agentgym.envs.toolapi:ToolAPIEnv")
