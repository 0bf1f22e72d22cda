"""`ToolEnv(tool_prompt=...)`: where the model learns about the tools."""

from __future__ import annotations

import pytest

import agentgym


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral", "pythonic"])
def test_system_tool_prompt_lists_schemas_and_a_parsable_example(parser):
    env = agentgym.make("calculator", tool_prompt="system", parser=parser)
    messages, _ = env.reset(seed=0)
    system = messages[0]["content"]
    assert '"name": "calculate"' in system
    example = system.split("To call a tool, write exactly:\n", 1)[1]
    parsed = env.parser.parse(example)
    assert [c.name for c in parsed.tool_calls] == ["calculate"] and not parsed.errors


def test_template_tool_prompt_keeps_schemas_out_of_the_messages():
    env = agentgym.make("calculator")
    messages, _ = env.reset(seed=0)
    assert "calculate" in messages[0]["content"]  # the env's own prose mentions it ...
    assert '"parameters"' not in messages[0]["content"]  # ... but no schema is pasted in
    assert env.tool_schemas[0]["function"]["name"] == "calculate"


def test_unknown_tool_prompt_is_a_config_error():
    with pytest.raises(agentgym.ConfigError, match="tool_prompt"):
        agentgym.make("calculator", tool_prompt="prose")
