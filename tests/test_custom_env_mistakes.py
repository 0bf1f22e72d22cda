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
        "status ok, reward 1.0; 1 tool error(s) in its turns, the first: 'lookup' returned data "
        "holding a Opaque"
    )
    assert result.detail.endswith("(fix the tool, or the call the reference makes)")


def test_a_module_named_by_its_file_says_to_drop_the_py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "run from the folder that holds it", to a user who ran from that folder."""
    (tmp_path / "my_capitals.py").write_text("raise SystemExit('imported')")
    monkeypatch.chdir(tmp_path)
    for given in ("my_capitals.py", "./my_capitals.py"):  # as typed, as a shell completes it
        with pytest.raises(ConfigError) as excinfo:
            agentgym.make(f"{given}:example/Capitals-v0")
        assert str(excinfo.value) == (
            f"cannot import {given!r}: name the module, not its file, before the colon: "
            "'my_capitals:example/Capitals-v0'"
        )  # and not imported meanwhile (it would exit)


@pytest.mark.parametrize(
    ("given", "folder"),
    [("/home/u/proj/myenv.py", "/home/u/proj"), ("../other/myenv.py", "../other")],
)
def test_a_file_outside_the_working_folder_says_where_to_run_from(given: str, folder: str) -> None:
    """Dotted, its path read as '/.home.u.proj.myenv' or '...other.myenv': no module name."""
    with pytest.raises(ConfigError) as excinfo:
        agentgym.make(f"{given}:Env")
    assert str(excinfo.value) == (
        f"cannot import {given!r}: name the module, not its file, before the colon: run from "
        f"{folder} (or add it to PYTHONPATH) and write 'myenv:Env'"
    )


class Builder(agentgym.ToolEnv):
    """A user's env with a helper of its own named like the one the metaclass used."""

    def _construct(self, x: object) -> object:
        return x


def test_a_users_method_named_construct_does_not_replace_building_the_env() -> None:
    env = Builder([agentgym.tool(lookup)], tasks=[{"prompt": "Lima?"}])
    assert isinstance(env, Builder)


def test_gymnasium_make_with_a_misspelt_option_names_the_one_meant() -> None:
    """`gymnasium.make` calls the class itself, past agentgym's registry: a misspelt option
    raised Python's TypeError from deep inside, naming neither the options nor the one meant."""
    with pytest.raises(ConfigError, match=r"CalculatorEnv does not take option\(s\) \['max_turn'\] "
                       r"\(did you mean max_turns\?\); it takes: .*num_tasks"):  # fmt: skip
        gymnasium.make("agentgym/Calculator-v0", max_turn=3)
    with pytest.raises(ConfigError, match=r"does not take option\(s\) \['foo'\]"):
        gymnasium.make("agentgym/Calculator-v0", render_mode="ansi", foo=1)


class OnlyMessages(agentgym.ToolEnv):
    """A user's env whose areset returns the messages alone, not (messages, info)."""

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        messages, _ = await super().areset(seed=seed, options=options)
        return messages


def test_an_areset_of_the_wrong_shape_is_an_error_episode_naming_the_contract() -> None:
    """It unpacked into the wrong names: "'NoneType' object is not subscriptable"."""
    env = OnlyMessages([agentgym.tool(lookup)], tasks=[{"prompt": "Lima?", "answer": "Peru"}])
    [played] = agentgym.rollout(lambda: env, agentgym.ScriptedPolicy(["Peru"]), tasks=[0])
    assert played.status == "error"
    assert played.error.splitlines()[-1].endswith(
        "OnlyMessages.areset must return (messages, info), a list and a dict, as Gymnasium's "
        "reset returns (observation, info); it returned list"
    )


@pytest.mark.parametrize(("define", "fix"), [
    (lambda: agentgym.ToolEnv([agentgym.tool(lookup), agentgym.tool(lookup)]),
     "rename one, @agentgym.tool(name=...)"),
    (lambda: agentgym.tool(lambda *cities: "Peru", name="many"),
     "give each argument a typed parameter of its own"),
    (lambda: agentgym.tool(lambda city: "Peru", name="untyped"), "(e.g. city: str)"),
])  # fmt: skip
def test_a_tool_mistake_names_its_fix(define: Any, fix: str) -> None:
    with pytest.raises(ConfigError) as refused:
        define()
    assert str(refused.value).endswith(fix) and "\n" not in str(refused.value)
