"""``rollout_mode: concat`` with a template that cannot keep history as a prefix is refused
before the first step (it used to run as ``auto`` and fail in the first update)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agentgym import ConfigError
from agentgym.trainers import GRPOConfig
from tests.conftest import TINY_RUN

#: The tiny model's tool-message end, and the same made Hermes-3-like: the newline after the
#: last tool message appears only once another message follows (history is rewritten).
TOOL_END = "{%- if loop.last or rest[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
HERMES_END = (
    "{%- if loop.last or rest[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>' + ('' if loop.last else '\\n') }}"
)


@pytest.mark.slow
def test_concat_with_a_template_that_rewrites_history_is_refused(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from agentgym.trainers import GRPOTrainer

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    template = (model / "chat_template.jinja").read_text()
    assert TOOL_END in template
    (model / "chat_template.jinja").write_text(template.replace(TOOL_END, HERMES_END))
    cfg = GRPOConfig.from_dict({
        **TINY_RUN, "model": str(model), "output_dir": str(tmp_path / "run"),
        "rollout_engine": "hf", "rollout_mode": "concat", "max_steps": 1,
    })  # fmt: skip
    with pytest.raises(ConfigError, match="rollout_mode='concat' but the chat template cannot"):
        GRPOTrainer(cfg).train()
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not any(
        "data/tasks" in line for line in (tmp_path / "run" / "metrics.jsonl").open()
    )  # no step ran
