"""`SamplingConfig` from a dict (what every token policy takes): a typo is one clear line."""

from __future__ import annotations

import math

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


@pytest.mark.parametrize(
    "knobs", [{"temperature": math.nan}, {"temperature": math.inf}, {"temperature": -0.1},
              {"top_p": math.nan}, {"min_p": math.nan}],
)  # fmt: skip
def test_values_no_sampler_can_use_are_refused(knobs: dict) -> None:
    # NaN fails every comparison, so a range check written as "x < 0" let it through
    with pytest.raises(ConfigError, match="sampling needs a finite temperature"):
        SamplingConfig(**knobs)
