"""Registry inputs refused early and in one line: entry points, Gymnasium's ``kwargs=``, options
an env sets itself, and a ``module:id`` whose module is not the user's file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import pytest

import agentgym
from agentgym import ConfigError, ToolEnv, UnknownEnvError
from agentgym import _registry as registry_module

CALCULATOR = "agentgym.envs.calculator:CalculatorEnv"


@pytest.fixture
def forget() -> Iterator[list[str]]:
    """Ids a test registers, unregistered after it (other tests make every registered env)."""
    ids: list[str] = []
    yield ids
    for env_id in ids:
        gymnasium.registry.pop(env_id, None)
        registry_module._OUR_IDS.discard(env_id)


# --- register: the entry point and Gymnasium's kwargs= -----------------------------------------


@pytest.mark.parametrize(
    ("entry_point", "fragment"),
    [
        (42, "must be an env class, a function returning an env, or a 'package.module:"),
        (None, "got NoneType None"),
        ("nosuchmod", "an entry point string must look like 'package.module:ClassName'"),
        ("pkg.mod:Class.attr", "must look like 'package.module:ClassName'"),
        ("pkg mod:Class", "must look like 'package.module:ClassName'"),
    ],
)
def test_register_refuses_an_entry_point_make_could_never_call(
    entry_point: Any, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment) as excinfo:
        agentgym.register("tests/BadEntry-v0", entry_point)
    assert "\n" not in str(excinfo.value)
    assert "tests/BadEntry-v0" not in gymnasium.registry  # nothing half-registered


def test_register_takes_gymnasiums_kwargs_merged_with_keywords(forget: list[str]) -> None:
    forget.append("tests/Calc5-v0")
    agentgym.register("tests/Calc5-v0", CALCULATOR, kwargs={"num_tasks": 5}, max_turns=2)
    env = agentgym.make("tests/Calc5-v0")
    assert len(env.tasks) == 5 and env.max_turns == 2
    assert len(gymnasium.make("tests/Calc5-v0").unwrapped.tasks) == 5  # Gymnasium sees them too


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"kwargs": {"num_tasks": 5}, "num_tasks": 3}, r"option\(s\) \['num_tasks'\] given both"),
        ({"kwargs": 5}, r"kwargs= holds the default options as a dict, got int 5"),
    ],
)
def test_register_refuses_kwargs_it_cannot_merge(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        agentgym.register("tests/CalcBad-v0", CALCULATOR, **options)
    assert "tests/CalcBad-v0" not in gymnasium.registry


# --- options an env's own constructor already passes to its base -------------------------------


def test_options_a_subclass_sets_itself_are_not_advertised() -> None:
    with pytest.raises(ConfigError, match=r"does not take option\(s\) \['foo'\]") as excinfo:
        agentgym.make("calculator", foo=1)
    advertised = str(excinfo.value).split("it takes: ")[1].split(", ")
    assert {"num_tasks", "max_turns", "parser"} <= set(advertised)
    assert not {"tools", "tasks", "rubric"} & set(advertised)  # the env passes these itself


@pytest.mark.parametrize("option", ["tools", "tasks", "rubric"])
def test_an_option_the_env_sets_itself_is_one_line(option: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        agentgym.make("calculator", **{option: "x"})
    message = str(excinfo.value)
    assert f"sets option(s) ['{option}'] itself" in message
    assert f"drop option(s) ['{option}']" in message and "\n" not in message


class PassesToolsUnseen(ToolEnv):
    """Passes ``tools`` through a starred list: its source does not name the option."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(*[[]], tasks=[{"prompt": "hi"}], **kwargs)


class CallsBaseByName(ToolEnv):
    """Calls ``ToolEnv.__init__(self, ...)`` by name, with ``tools`` positional."""

    def __init__(self, **kwargs: Any) -> None:
        ToolEnv.__init__(self, [], tasks=[{"prompt": "hi"}], **kwargs)


def test_multiple_values_for_an_option_always_becomes_the_one_line_error(
    forget: list[str],
) -> None:
    forget.append("tests/PassesToolsUnseen-v0")
    agentgym.register("tests/PassesToolsUnseen-v0", PassesToolsUnseen)
    with pytest.raises(ConfigError) as excinfo:  # the constructor's TypeError, translated
        agentgym.make("tests/PassesToolsUnseen-v0", tools=[])
    assert str(excinfo.value) == (
        "tests/PassesToolsUnseen-v0 sets option(s) ['tools'] itself (its constructor passes them "
        "to its base class), so they cannot be given; drop option(s) ['tools']"
    )


def test_a_base_init_called_by_name_sets_its_positional_options(forget: list[str]) -> None:
    forget.append("tests/CallsBaseByName-v0")
    agentgym.register("tests/CallsBaseByName-v0", CallsBaseByName)
    with pytest.raises(ConfigError, match=r"sets option\(s\) \['tools'\] itself"):
        agentgym.make("tests/CallsBaseByName-v0", tools=[])
    assert agentgym.make("tests/CallsBaseByName-v0", max_turns=2).max_turns == 2


# --- module:id, where the module is not the user's file ----------------------------------------

CAPITALS = """
import agentgym

class CapitalsEnv(agentgym.ToolEnv):
    def __init__(self, **kwargs):
        super().__init__(tasks=[{"prompt": "Which country is Lima in?"}], **kwargs)

agentgym.register("ENV_ID", CapitalsEnv)
"""


def capitals(env_id: str) -> str:
    """The source of a user's module registering a one-task env under ``env_id``."""
    return CAPITALS.replace("ENV_ID", env_id)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder of the user's, the import path restored after the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def test_a_module_python_already_has_is_named_as_shadowing_the_users_file(folder: Path) -> None:
    # textwrap is imported already, so the import returns Python's, never this file
    (folder / "textwrap.py").write_text(capitals("tests/Shadowed-v0"))
    with pytest.raises(UnknownEnvError) as excinfo:
        agentgym.make("textwrap:tests/Shadowed-v0")
    message = str(excinfo.value)
    assert f"module 'textwrap' was imported from {textwrap.__file__}" in message
    assert "textwrap.py in the current folder is shadowed by it; rename textwrap.py" in message
    assert "'my_textwrap:tests/Shadowed-v0'" in message and "\n" not in message


def test_a_users_module_without_the_id_is_named_with_its_file(
    folder: Path, forget: list[str]
) -> None:
    forget.append("tests/Registered-v0")
    (folder / "users_envs.py").write_text(capitals("tests/Registered-v0"))
    with pytest.raises(UnknownEnvError) as excinfo:
        agentgym.make("users_envs:tests/Registred-v0")
    message = str(excinfo.value)
    assert f"module 'users_envs' (imported from {folder / 'users_envs.py'})" in message
    assert "registers no env 'tests/Registred-v0'" in message
    assert "Did you mean 'tests/Registered-v0'?" in message and "shadowed" not in message


def test_the_working_folder_goes_first_for_the_module_then_last(folder: Path) -> None:
    (folder / "users_first.py").write_text("import sys\nSEARCHED_FIRST = sys.path[0]\n")
    agentgym.make("users_first:agentgym/Calculator-v0")
    cwd = os.getcwd()
    assert sys.modules["users_first"].SEARCHED_FIRST == cwd  # as `python -m` searches it
    assert sys.path.count(cwd) == 1 and sys.path[-1] == cwd  # then never ahead of packages


def test_the_cli_imports_the_working_folders_module_over_pythons_own(tmp_path: Path) -> None:
    # Python has a `test` package (its own test suite); `python -c` from here imports this one
    (tmp_path / "test.py").write_text(capitals("me/Cap-v0"))
    agentgym_cli = str(Path(sys.executable).with_name("agentgym"))
    proc = subprocess.run([agentgym_cli, "check", "test:me/Cap-v0"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "gymnasium check_env" in proc.stdout
