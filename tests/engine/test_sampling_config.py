"""`SamplingConfig` from a dict (what every token policy takes): a typo is one clear line."""

from __future__ import annotations

import pytest

from agentgym import ConfigError
from agentgym.engine import SamplingConfig, TokenPolicy


def test_a_misspelt_knob_names_the_one_meant() -> None:
    with pytest.raises(ConfigError, match=r"unknown sampling knob 'temprature'; did you mean "
                       r"'temperature'\?"):  # fmt: skip
        TokenPolicy({"temprature": 1.0})


def test_known_knobs_build_the_config() -> None:
    policy = TokenPolicy({"temperature": 0.5, "max_tokens": 7, "stop": ["</tool_call>"]})
    assert policy.sampling == SamplingConfig(temperature=0.5, max_tokens=7, stop=["</tool_call>"])
