"""An adapter load that meets a dead engine says the engine died, not that the adapter is bad.

Why: after vLLM's engine core was killed (out of memory, ``kill -9``), the run's next adapter
load failed as "vLLM refused to load the adapter at .../adapters/v4: EngineCore encountered
an issue": it blamed the adapter and did not say to resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgym import ModelError
from agentgym.engine import VLLMPolicy
from tests.conftest import require
from tests.engine.conftest import child_pids, kill_engine
from tests.engine.episodes import make_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]


def test_an_adapter_load_after_the_engine_core_was_killed_says_to_resume(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    require("vllm")
    adapter = make_adapter(tiny_model_dir, tmp_path / "v1", seed=1)
    before = child_pids()
    with VLLMPolicy(tiny_model_dir, dtype="float32", max_model_len=1024, enable_lora=True,
                    max_lora_rank=8) as doomed:  # fmt: skip
        kill_engine(before)
        with pytest.raises(ModelError) as raised:
            doomed.load_adapter(adapter)
    message = str(raised.value)
    assert message.startswith("the vLLM engine died"), message
    assert "run it again with --resume" in message
