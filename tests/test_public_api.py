"""The public surface: pinned `__all__`, and an import without heavy side effects."""

from __future__ import annotations

import ast
import subprocess
import sys

import agentgym

PUBLIC_NAMES = [
    "AssistantTurnSpace",
    "CheckResult",
    "Completion",
    "ConfigError",
    "ContextLengthError",
    "ConversationError",
    "ENTRY_POINT_GROUP",
    "Env",
    "EnvPool",
    "EpisodeSpec",
    "EpisodeState",
    "Error",
    "Forfeit",
    "InfraError",
    "MessagesSpace",
    "ModelError",
    "OpenAIPolicy",
    "ParsedTurn",
    "Policy",
    "PrefixMismatchError",
    "Rubric",
    "RubricResult",
    "SandboxError",
    "ScriptedPolicy",
    "TaskSplits",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolCallParser",
    "ToolEnv",
    "ToolError",
    "ToolTimeoutError",
    "Trajectory",
    "Turn",
    "UnknownEnvError",
    "arollout",
    "check",
    "get_parser",
    "load_plugins",
    "load_tasks",
    "make",
    "openapi_tools",
    "read_jsonl",
    "recover_jsonl",
    "register",
    "register_parser",
    "registered_envs",
    "rollout",
    "run_episode",
    "select_split",
    "split_tasks",
    "summarize",
    "tool",
    "write_jsonl",
]


def test_all_is_pinned() -> None:
    assert sorted(agentgym.__all__) == PUBLIC_NAMES
    assert len(set(agentgym.__all__)) == len(agentgym.__all__)


def test_every_public_name_exists() -> None:
    missing = [name for name in agentgym.__all__ if not hasattr(agentgym, name)]
    assert missing == []


def test_error_tree() -> None:
    assert issubclass(agentgym.UnknownEnvError, agentgym.ConfigError)
    assert issubclass(agentgym.ToolTimeoutError, agentgym.ToolError)
    assert issubclass(agentgym.ToolArgumentsError, agentgym.ToolError)
    assert issubclass(agentgym.Forfeit, agentgym.ToolError)  # the model's doing, scored 0
    assert issubclass(agentgym.ContextLengthError, agentgym.ConversationError)  # truncated
    assert not issubclass(agentgym.ConversationError, agentgym.InfraError)
    assert issubclass(agentgym.ModelError, agentgym.InfraError)
    assert issubclass(agentgym.SandboxError, agentgym.InfraError)
    for name in ("ConfigError", "ToolError", "InfraError"):
        assert issubclass(getattr(agentgym, name), agentgym.Error)
    assert not issubclass(agentgym.ToolError, agentgym.InfraError)


def test_import_has_no_heavy_dependencies() -> None:
    code = (
        "import agentgym, sys; "
        "print([m for m in ('torch','vllm','docker','transformers') if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert ast.literal_eval(proc.stdout.strip()) == []
