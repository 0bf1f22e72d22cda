"""The public surface: pinned `__all__`, and an import without heavy side effects."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import pytest

import agentgym
from tests.conftest import require

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


#: Each subpackage's pinned `__all__`, and the optional dependency its names need.
SUBPACKAGE_NAMES: dict[str, tuple[list[str], str | None]] = {
    "agentgym.trainers": ([
        "Advantages", "Batch", "GRPOConfig", "GRPOTrainer", "LossSpec", "SFTConfig", "Sample",
        "StaleAdapterError", "build_samples", "collate", "export_run", "group_advantages",
        "grpo_loss", "sft_warm_start", "token_logprobs", "trajectory_advantages",
    ], "torch"),
    "agentgym.engine": ([
        "AdapterPublishError", "AdapterVersion", "ChatRenderer", "HFPolicy", "LocalServer",
        "ModeDecision", "PublishReport", "RemoteVLLMPolicy", "SamplingConfig", "ServerOptions",
        "StickyLeastLoaded", "TemplateError", "TokenEpisode", "TokenPolicy", "VLLMFleet",
        "VLLMPolicy", "serve_router", "serve_vllm", "serve_vllm_fleet", "stage_adapter",
    ], None),
    "agentgym.parsers": ([
        "ParsedTurn", "ToolCall", "ToolCallParser", "available_parsers", "get_parser",
        "register_parser",
    ], None),
    "agentgym.mcp": (["MCPServer", "MCPServerError", "MCPToolEnv", "close_shared_servers"], None),
    "agentgym.runs": ([
        "EXIT_CONFIG", "EXIT_INFRA", "JobKind", "JobQueue", "RunStatus", "RunStore", "TERMINAL",
        "agentgym_home", "check_job", "is_infra_failure", "job_command", "parse_config",
        "resolve_db_url", "submit_job", "track_run",
    ], None),
    "agentgym.serve": (["create_app"], "fastapi"),
}  # fmt: skip


@pytest.mark.parametrize("module", SUBPACKAGE_NAMES)
def test_subpackage_all_is_pinned_and_importable(module: str) -> None:
    names, needs = SUBPACKAGE_NAMES[module]
    if needs:
        require(needs)
    package = importlib.import_module(module)
    assert sorted(package.__all__) == names
    assert len(set(package.__all__)) == len(package.__all__)
    missing = [name for name in names if not hasattr(package, name)]  # lazy ones import here
    assert missing == []


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
