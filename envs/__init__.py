"""Built-in environments; each family registers itself with one `register` call here."""

from agentgym._registry import register


def register_builtin_envs() -> None:
    """Register the built-in envs in Gymnasium's registry (entry points import lazily)."""
    register("agentgym/Calculator-v0", "agentgym.envs.calculator:CalculatorEnv")
    register("agentgym/HumanEval-v0", "agentgym.envs.humaneval:HumanEvalEnv")
    register("agentgym/DocSearch-v0", "agentgym.envs.docsearch:DocSearchEnv")
