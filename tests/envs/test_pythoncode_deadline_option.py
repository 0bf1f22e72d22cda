"""An episode deadline given to PythonCode as an env option is refused with where it belongs.

Why not a deadline option checked against the env's per-call timeout: the time limit of an
episode is the run's (``agentgym eval --episode-timeout``, ``rollout(episode_timeout=)``), and
one below ``tool_timeout`` is legitimate there: the timeout caps a call, which usually ends
in milliseconds. ``episode_deadline_s=`` was refused with a guess, ``max_episode_tokens``,
that does another job.
"""

from __future__ import annotations

import pytest

import agentgym
from agentgym import ConfigError


@pytest.mark.parametrize("option", ["episode_deadline_s", "episode_timeout", "deadline"])
def test_a_deadline_option_points_at_the_runs_episode_timeout(option: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        agentgym.make("agentgym/PythonCode-v0", backend="local", **{option: 1.0})
    message = str(excinfo.value)
    assert f"does not take option(s) [{option!r}]; it takes: " in message
    assert message.endswith(
        "an episode's time limit is the run's, not the env's: agentgym eval --episode-timeout S, "
        "or agentgym.rollout(..., episode_timeout=S)"
    )
    assert "did you mean" not in message and "\n" not in message
