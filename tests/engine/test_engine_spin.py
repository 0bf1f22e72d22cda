"""The busy-wait window agentgym gives vLLM's processes: too short a window is refused."""

from __future__ import annotations

import os

import pytest

from agentgym import ConfigError
from agentgym.engine import _engine_spin
from tests.conftest import require


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("0.02", 0.02), ("0.005", 0.005), ("1", 1.0), ("0.001", None), ("0", None), ("-1", None),
     ("soon", None)],
)  # fmt: skip
def test_only_windows_of_at_least_5_ms_are_accepted(value: str, seconds: float | None) -> None:
    assert _engine_spin.window_seconds(value) == seconds


def test_a_window_vllm_cannot_run_with_fails_before_the_engine_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require("vllm")
    monkeypatch.setenv(_engine_spin.ENV_VAR, "0")  # vLLM's worker exited mid-run with this
    with pytest.raises(ConfigError, match=r"AGENTGYM_VLLM_SPIN_S='0'.*seconds >= 0.005"):
        _engine_spin.enable_for_cpu_engines()
    monkeypatch.setenv(_engine_spin.ENV_VAR, "")  # empty: vLLM's own second, as documented
    _engine_spin.enable_for_cpu_engines()
    monkeypatch.delenv(_engine_spin.ENV_VAR)
    _engine_spin.enable_for_cpu_engines()  # the CPU build here: agentgym's 20 ms
    assert os.environ[_engine_spin.ENV_VAR] == str(_engine_spin.SPIN_SECONDS)
