"""agentgym: Gymnasium-style multi-turn agentic RL environments for open-weight LLMs.

The public surface is everything in ``__all__``; modules starting with ``_`` are private.
Importing agentgym registers the built-in envs in Gymnasium's registry and nothing else:
no torch, vLLM or docker import until they are used.
"""

from ._check import CheckResult, check
from ._env import AssistantTurnSpace, Env, MessagesSpace
from ._errors import (
    ConfigError,
    ContextLengthError,
    ConversationError,
    Error,
    Forfeit,
    InfraError,
    ModelError,
    SandboxError,
    ToolArgumentsError,
    ToolError,
    ToolTimeoutError,
    UnknownEnvError,
)
from ._openapi import openapi_tools
from ._policies import OpenAIPolicy, Policy, ScriptedPolicy
from ._registry import ENTRY_POINT_GROUP, load_plugins, make, register, registered_envs
from ._rollout import EnvPool, EpisodeSpec, arollout, rollout, run_episode
from ._rubric import Rubric, RubricResult
from ._summary import summarize
from ._tasks import TaskSplits, load_tasks, select_split, split_tasks
from ._tool_env import EpisodeState, ToolEnv
from ._tools import Tool, tool
from ._trajectory import (
    PrefixMismatchError,
    Trajectory,
    Turn,
    read_jsonl,
    recover_jsonl,
    write_jsonl,
)
from ._types import Completion
from .parsers import ParsedTurn, ToolCall, ToolCallParser, get_parser, register_parser

__version__ = "0.1.0"

__all__ = [
    "ENTRY_POINT_GROUP",
    "AssistantTurnSpace",
    "CheckResult",
    "Completion",
    "ConfigError",
    "ContextLengthError",
    "ConversationError",
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


def _register_builtins() -> None:
    from .envs import register_builtin_envs

    register_builtin_envs()


_register_builtins()
