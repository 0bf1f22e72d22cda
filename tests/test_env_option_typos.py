"""A misspelt env option or env id is refused in one line that names the one meant.

The list of what an env takes runs to a dozen names, and the registry's id pattern alone did
not say that the usual mistake is a missing version.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import agentgym
from agentgym import ConfigError

AGENTGYM = Path(sys.executable).parent / "agentgym"


def test_a_misspelt_option_names_the_one_meant() -> None:
    with pytest.raises(ConfigError) as excinfo:
        agentgym.make("agentgym/Calculator-v0", max_turn=3)
    message = str(excinfo.value)
    assert message.startswith(
        "agentgym/Calculator-v0 does not take option(s) ['max_turn'] (did you mean max_turns?); "
        "it takes: "
    )
    assert "\n" not in message


def test_an_option_like_no_other_gets_no_guess() -> None:
    with pytest.raises(ConfigError) as excinfo:
        agentgym.make("agentgym/Calculator-v0", foo=1)
    assert "did you mean" not in str(excinfo.value)


def test_max_episode_steps_is_not_taken_for_max_episode_tokens() -> None:
    """The closest name does another job; the option's own hint says which one does this."""
    with pytest.raises(ConfigError) as excinfo:
        agentgym.make("agentgym/Calculator-v0", max_episode_steps=3)
    assert "did you mean" not in str(excinfo.value)
    assert "use max_turns" in str(excinfo.value)


def test_the_command_line_names_the_option_meant(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(AGENTGYM), "eval", "calculator", "-n", "1", "--env-arg", "max_turn=3",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "does not take option(s) ['max_turn'] (did you mean max_turns?)" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("env_id", "meant"),
    [
        ("myorg/Search", "myorg/Search-v0"),
        ("Search", "Search-v0"),
        ("myorg/Search-v01", "myorg/Search-v1"),
    ],
)
def test_an_env_id_without_a_plain_version_is_refused_with_the_id_to_write(
    env_id: str, meant: str
) -> None:
    with pytest.raises(ConfigError, match=f"; write '{meant}'$"):
        agentgym.register(env_id, "tests.nowhere:Env")


@pytest.mark.parametrize("env_id", ["my env", "myorg/Search-V0", "myorg/Search-v1.2",
                                    "myorg/Search-v\u00b2"])  # a digit int() refuses
def test_an_id_with_no_plain_mend_gets_the_pattern_alone(env_id: str) -> None:
    with pytest.raises(ConfigError, match=r"must look like 'namespace/Name-v0'") as excinfo:
        agentgym.register(env_id, "tests.nowhere:Env")
    assert "write" not in str(excinfo.value)


def test_options_given_in_a_dict_say_to_give_them_as_keywords() -> None:
    """`rollout` takes ``env_kwargs={...}``; `make` and `check` take the options themselves."""
    with pytest.raises(ConfigError, match=r"give the env's options themselves as keywords"):
        agentgym.make("agentgym/Calculator-v0", env_kwargs={"num_tasks": 2})
