"""Mistakes of a user writing their own env, each refused or reported with its fix.

A tool that fails every call passed `agentgym check` silently: the reference answered anyway,
so its episode earned its reward and the row read ``pass``, while every call of the tool (here:
one returning an object that is not JSON data) failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import pytest

import agentgym
from agentgym import ConfigError
from agentgym import _registry as registry_module

ENV_ID = "tests/S56NonJsonTool-v0"


class Opaque:
    """An object a tool must not return: its text would be a memory address."""


def lookup(city: str) -> Any:
    """Return the country a city is in.

    Args:
        city: the city's English name.
    """
    return {"country": "Peru", "source": Opaque()}


def correct(completion: str, answer: str) -> float:
    return float(answer in completion)


class OpaqueToolEnv(agentgym.ToolEnv):
    def __init__(self, **kwargs: Any) -> None:
        tasks = [{"prompt": "Which country is Lima in?", "answer": "Peru"}]
        super().__init__([lookup], tasks=tasks, rubric=agentgym.Rubric([correct]), **kwargs)

    def reference_turns(self, task: dict[str, Any]) -> list[str]:
        call = agentgym.ToolCall("lookup", {"city": "Lima"})
        return [self.parser.render("", [call]), task["answer"]]


@pytest.fixture
def env_id() -> Iterator[str]:
    agentgym.register(ENV_ID, OpaqueToolEnv)
    yield ENV_ID
    del gymnasium.registry[ENV_ID]
    registry_module._OUR_IDS.discard(ENV_ID)


def test_a_reference_whose_tool_calls_fail_warns_naming_the_first_failure(env_id: str) -> None:
    result = next(r for r in agentgym.check(env_id) if r.name == "reference episode")
    assert result.verdict == "warn" and result.passed
    assert result.detail.startswith(
        "status ok, reward 1.0; 1 of its tool calls failed, the first: 'lookup' returned data "
        "holding a Opaque"
    )
    assert result.detail.endswith("(fix the tool, or the call the reference makes)")


def test_a_module_named_by_its_file_says_to_drop_the_py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "run from the folder that holds it", to a user who ran from that folder."""
    (tmp_path / "s56_capitals.py").write_text("")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as excinfo:
        agentgym.make("s56_capitals.py:example/Capitals-v0")
    assert str(excinfo.value) == (
        "cannot import 's56_capitals.py': name the module, not its file, before the colon: "
        "'s56_capitals:example/Capitals-v0'"
    )
