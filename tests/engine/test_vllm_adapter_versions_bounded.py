"""A long run's adapter versions leave no per-version state behind in `VLLMPolicy`.

Why: a trainer loads a new adapter version every step and samples with it. The policy counted
each version's requests in flight and left the count at 0 when they ended, so the counts of
every version ever loaded piled up for the life of the run (a 200-version soak left one per
version that sampled). Retired versions must leave no trace: only versions still serving a
request are counted, and `adapters` keeps no more than ``max_loras`` idle ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agentgym.engine import VLLMPolicy
from tests.conftest import require
from tests.engine.episodes import make_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]

VERSIONS = 12


async def test_many_adapter_versions_leave_no_counts_or_versions_behind(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    require("vllm")
    weights = make_adapter(tiny_model_dir, tmp_path / "weights", seed=1)
    with VLLMPolicy(tiny_model_dir, dtype="float32", max_model_len=1024, enable_lora=True,
                    max_lora_rank=8, sampling={"max_tokens": 2}) as policy:  # fmt: skip
        prompt = policy.renderer.prompt_ids([{"role": "user", "content": "hi"}], [])
        for n in range(1, VERSIONS + 1):
            folder = shutil.copytree(weights, tmp_path / f"v{n}")  # a folder per version
            assert await policy.aload_adapter(folder) == n
            completion = await policy.generate_ids(prompt, seed=n)
            assert completion.adapter_version == n
        # nothing samples now: no version is counted as in flight (private: no public view)
        assert policy._in_flight == {}
        assert [a.version for a in policy.adapters] == [VERSIONS - 1, VERSIONS]
