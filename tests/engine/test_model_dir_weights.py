"""A model folder must hold weights and tokenizer files, not only ``config.json``.

A folder without weights passed the check: ``--policy hf`` printed an 81-line traceback and
``--policy vllm`` failed after a minute's engine start as an infrastructure error (exit 75,
retried by the queue). A folder without any tokenizer file was told its vocabulary is missing
"not tokenizer_config.json alone", a file it did not have either. Only names are looked at.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym import ConfigError
from agentgym.engine._model_dir import check_model_name, require_model_folder
from tests.test_cli_eval_refusals import one_error_line, run

TOKENIZER = ("tokenizer_config.json", "tokenizer.json")


def folder(root: Path, *files: str, index: dict[str, list[str]] | None = None) -> Path:
    """A model folder of ``config.json`` and ``files`` (their content is never read).

    ``index``: index file name -> the shards its weight_map names.
    """
    root.mkdir()
    for name in ("config.json", *files):
        (root / name).write_text("{}")
    for name, shards in (index or {}).items():
        weight_map = {f"layer{i}.weight": shard for i, shard in enumerate(shards)}
        (root / name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
SAFE_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"


@pytest.mark.parametrize(
    ("files", "index"),
    [
        (["model.safetensors"], None),
        (["pytorch_model.bin"], None),
        (SHARDS, {SAFE_INDEX: SHARDS}),
        # a hub download of the safetensors alone keeps the .bin index: not a broken folder
        (["model.safetensors"], {BIN_INDEX: ["pytorch_model-00001-of-00002.bin"]}),
    ],
    ids=["safetensors", "bin", "shards", "safetensors-beside-a-bin-index"],
)
def test_a_whole_folder_passes(
    tmp_path: Path, files: list[str], index: dict[str, list[str]] | None
) -> None:
    model = folder(tmp_path / "m", *files, *TOKENIZER, index=index)
    assert require_model_folder(model) == model


@pytest.mark.parametrize(
    ("files", "index", "missing"),
    [
        ([*TOKENIZER], None, "no weights (no *.safetensors or *.bin file)"),
        ([SHARDS[0], *TOKENIZER], {SAFE_INDEX: SHARDS},
         f"1 of the 2 shards {SAFE_INDEX} names are missing ({SHARDS[1]} ...)"),
        (["model.safetensors"], None, "no tokenizer files (none of tokenizer_config.json, "),
    ],
    ids=["no-weights", "a-shard-missing", "no-tokenizer"],
)  # fmt: skip
def test_a_folder_missing_a_part_is_one_config_error_naming_it(
    tmp_path: Path, files: list[str], index: dict[str, list[str]] | None, missing: str
) -> None:
    model = folder(tmp_path / "m", *files, index=index)
    with pytest.raises(ConfigError) as caught:
        require_model_folder(model)
    assert str(caught.value).startswith(f"{model} is not a whole model folder: {missing}")
    assert "tokenizer_config.json alone" not in str(caught.value)
    with pytest.raises(ConfigError):  # a queued job is refused when submitted, not by its worker
        check_model_name(str(model))


@pytest.mark.parametrize("policy", ["hf", "vllm"])
def test_eval_refuses_a_folder_without_weights_in_one_line(tmp_path: Path, policy: str) -> None:
    model = folder(tmp_path / "m", *TOKENIZER)
    proc = run(tmp_path, "calculator", "--policy", policy, "--model-path", str(model), "-n", "1")
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc).startswith(f"{model} is not a whole model folder: no weights")
