"""``agentgym eval --policy vllm|hf``: in-process engines, through the installed console script
where its process is part of what is checked (the sockets it leaves at exit, its engine's log,
its refusals' only line), in this process (`agentgym_here`) otherwise.

The engine starts once per run (20-90 s on two cores, more on a busy machine); the tiny local
model samples noise, so the episodes are short, but every turn must carry what a trainer reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agentgym import read_jsonl
from agentgym.engine import _rpc_dir
from tests.conftest import VLLMServer, agentgym_here, require
from tests.test_check import HISTORY_REWRITING_TEMPLATE
from tests.trainers.test_export import write_run

AGENTGYM = Path(sys.executable).parent / "agentgym"


def run(
    *args: str, timeout: float = 120, temp_dir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
    if temp_dir is not None:  # the command's temp folder, and vLLM's sockets in it by default
        env["TMPDIR"] = str(temp_dir)
        env.pop(_rpc_dir.ENV_VAR, None)
    return subprocess.run(
        [str(AGENTGYM), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


#: The tiny template, plus what Qwen3's does with ``enable_thinking=False``: an empty think
#: block opens each generation prompt, and the finished turn does not keep it (per_turn).
THINK_OFF = (
    "{%- if enable_thinking is defined and enable_thinking is false %}<think></think>{%- endif %}"
)


def model_with_template(tiny_model_dir: Path, folder: Path, template: str) -> Path:
    """A copy of the tiny model whose tokenizer has ``template`` as its chat template."""
    shutil.copytree(tiny_model_dir, folder)
    (folder / "chat_template.jinja").write_text(template)  # where transformers keeps it
    return folder


def thinking_switch(tiny_model_dir: Path) -> str:
    template = (tiny_model_dir / "chat_template.jinja").read_text()
    opening = "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    assert template.endswith(opening)
    return template.removesuffix("{%- endif %}") + THINK_OFF + "{%- endif %}"


@pytest.mark.vllm
@pytest.mark.engine
@pytest.mark.slow
def test_eval_vllm_records_token_ids_mode_and_adapter_version(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    require("vllm")
    model = model_with_template(tiny_model_dir, tmp_path / "model", thinking_switch(tiny_model_dir))
    out = tmp_path / "run"
    temp_dir = Path(tempfile.mkdtemp(prefix="t"))  # short: a socket's path fits in 107 bytes
    try:
        proc = run(
            "eval", "calculator", "--policy", "vllm", "--model-path", str(model),
            "-n", "2", "-g", "2", "--max-tokens", "12", "--temperature", "0.7", "--seed", "3",
            "--chat-template-kwargs", '{"enable_thinking": false}', "--out", str(out),
            timeout=600, temp_dir=temp_dir,
        )  # fmt: skip
        sockets = [path.name for path in temp_dir.rglob("*") if path.is_socket()]
        rpc_dirs = [path.name for path in temp_dir.glob("agentgym-rpc-*")]
    finally:
        shutil.rmtree(temp_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sockets == [] and rpc_dirs == [], f"vLLM's sockets left behind: {sockets}, {rpc_dirs}"
    assert "rollout mode per_turn" in proc.stderr  # decided before the episodes, and said
    trajectories = list(read_jsonl(out / "trajectories.jsonl"))
    assert len(trajectories) == 4
    tokenizer = require("transformers").AutoTokenizer.from_pretrained(str(model))
    for trajectory in trajectories:
        assert trajectory.status in ("ok", "truncated"), trajectory.error
        assert trajectory.mode == "per_turn"  # the kwarg reached the engine's template
        for turn in trajectory.turns:
            assert turn.prompt_ids and turn.completion_ids  # exact ids, token in / token out
            assert tokenizer.decode(turn.prompt_ids).endswith("assistant\n<think></think>")
            assert len(turn.completion_ids) <= 12  # --max-tokens is per turn
            assert len(turn.logprobs or []) == len(turn.completion_ids)
            assert turn.adapter_version == 0  # the base weights sampled it
    run_config = json.loads((out / "run.json").read_text())
    assert run_config["policy"] == "vllm" and run_config["rollout_mode"] == "auto"
    assert run_config["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.slow
def test_eval_hf_samples_token_exact_turns_without_vllm(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``--policy hf``: the same records from transformers, for machines without vLLM.

    In this process (`agentgym_here`): the records are tested, not the command's process."""
    out = tmp_path / "run"
    proc = agentgym_here(
        "eval", "calculator", "--policy", "hf", "--model-path", str(tiny_model_dir),
        "-n", "2", "-g", "2", "--max-tokens", "12", "--seed", "3", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollout mode concat" in proc.stderr
    trajectories = list(read_jsonl(out / "trajectories.jsonl"))
    assert len(trajectories) == 4
    for trajectory in trajectories:
        assert trajectory.status in ("ok", "truncated"), trajectory.error
        for turn in trajectory.turns:
            assert turn.prompt_ids and 0 < len(turn.completion_ids) <= 12
            assert len(turn.logprobs or []) == len(turn.completion_ids)
    assert json.loads((out / "run.json").read_text())["policy"] == "hf"


def eval_with_adapter(
    policy: str, adapter: Path, out: Path, *, here: bool = False
) -> str:
    """``agentgym eval --adapter`` on two tasks without ``--model-path``; returns its stderr.

    Through the console script, or in this process (`agentgym_here`) with ``here``: vLLM's
    log (the dtype it chose) is whole only in the console script's output; its engine
    processes and its import-time log handlers write past this process's capture."""
    args = ("eval", "calculator", "--policy", policy, "--adapter", str(adapter), "-n", "2",
            "--max-tokens", "12", "--seed", "3", "--out", str(out))  # fmt: skip
    proc = agentgym_here(*args) if here else run(*args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # float32 on the CPU, as a run's rollouts (vLLM chose bfloat16, with a warning per weight)
    assert "with dtype torch.bfloat16" not in proc.stdout + proc.stderr
    return proc.stderr


def assert_sampled_with(adapter: Path, base: Path, out: Path) -> None:
    """Every turn in ``out`` was sampled by ``adapter`` (version 1) on ``base``, not by ``base``.

    The turns' logprobs are those transformers computes with the adapter, within 0.02 (vLLM's
    CPU LoRA path sums in another order: 0.003-0.005 apart in fp32 here), and far from those
    without it (0.5-0.6 apart here).
    """
    from agentgym.engine import HFPolicy

    with_adapter = HFPolicy(base, adapter=adapter, dtype="float32")
    without = HFPolicy(base, dtype="float32")
    turns = [turn for episode in read_jsonl(out / "trajectories.jsonl") for turn in episode.turns]
    assert turns
    for turn in turns:
        assert turn.adapter_version == 1
        args = (turn.prompt_ids, turn.completion_ids)
        assert turn.logprobs == pytest.approx(with_adapter.token_logprobs(*args), abs=2e-2)
        base_logprobs = without.token_logprobs(*args)
        assert max(abs(a - b) for a, b in zip(turn.logprobs or [], base_logprobs)) > 0.1
    run_config = json.loads((out / "run.json").read_text())
    assert run_config["adapter"] == str(adapter.resolve())
    assert run_config["model"] == str(base.resolve())  # --model-path: the adapter's base


@pytest.mark.vllm
@pytest.mark.engine
@pytest.mark.slow
def test_eval_samples_with_a_runs_trained_adapter_on_vllm(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``--adapter RUN``: the newest checkpoint's adapter, on the base it records, no merge."""
    require("vllm")
    run_dir = write_run(tmp_path, tiny_model_dir, {2: 0, 4: 1})
    stderr = eval_with_adapter("vllm", run_dir, tmp_path / "eval")
    adapter = run_dir / "checkpoints" / "step-000004" / "adapter"
    assert f"adapter {adapter.resolve()} loaded as version 1" in stderr
    assert_sampled_with(adapter, tiny_model_dir, tmp_path / "eval")


@pytest.mark.slow
def test_eval_samples_with_an_exported_adapter_on_transformers(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """In this process: transformers samples in the command's own process, and its records are
    what is checked (the vLLM twin above runs the console script)."""
    from agentgym.trainers import export_run

    run_dir = write_run(tmp_path, tiny_model_dir, {2: 0})
    adapter = export_run(run_dir, tmp_path / "exported")
    eval_with_adapter("hf", adapter, tmp_path / "eval", here=True)
    assert_sampled_with(adapter, tiny_model_dir, tmp_path / "eval")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param(["--chat-template-kwargs", '{"enable_thinkng": false}'],
                     "--chat-template-kwargs: the template never reads 'enable_thinkng'",
                     id="unread-kwarg"),
        pytest.param(["--rollout-mode", "concat"], "--rollout-mode concat, but the chat template",
                     id="concat-impossible"),
    ],
)  # fmt: skip
def test_eval_vllm_refuses_before_the_engine_starts(
    tiny_model_dir: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    """Checked on the tokenizer alone: exit 2 in seconds, nothing written."""
    model = model_with_template(tiny_model_dir, tmp_path / "model", HISTORY_REWRITING_TEMPLATE)
    out = tmp_path / "run"
    proc = run(
        "eval", "calculator", "--policy", "vllm", "--model-path", str(model), *extra,
        "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("broken", ["another-base", "config-not-json"])
def test_eval_vllm_refuses_a_broken_adapter_before_the_engine_starts(
    tiny_model_dir: Path, tmp_path: Path, broken: str
) -> None:
    """The adapter was checked by `load_adapter` only after `policy.start()` (30 s here), and
    a config that is not JSON printed a traceback."""
    require("peft")
    from agentgym.engine.tiny import build_tiny_model, save_random_adapter

    if broken == "another-base":
        other = build_tiny_model(tmp_path / "other", hidden_size=256, num_heads=4)
        adapter, message = save_random_adapter(other, tmp_path / "adapter", rank=8), "does not fit"
    else:
        adapter = save_random_adapter(tiny_model_dir, tmp_path / "adapter", rank=8)
        (adapter / "adapter_config.json").write_text("{not json")
        message = "cannot be read as JSON"
    out = tmp_path / "run"
    proc = run(
        "eval", "calculator", "--policy", "vllm", "--model-path", str(tiny_model_dir),
        "--adapter", str(adapter), "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.engine
def test_eval_vllm_on_a_server_keeps_token_ids_in_and_out(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """``--server``: the prompts go to a running vLLM server as ids; the same record comes back.

    In this process: the server is the engine here, the command's own process is not tested.
    """
    out = tmp_path / "run"
    served = ("--model-path", str(vllm_server.model_dir), "--server", vllm_server.base_url)
    proc = agentgym_here(
        "eval", "calculator", "--policy", "vllm", *served, "--model", vllm_server.model,
        "-n", "2", "-g", "2", "--max-tokens", "12", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    trajectories = list(read_jsonl(out / "trajectories.jsonl"))
    assert len(trajectories) == 4
    for trajectory in trajectories:
        assert trajectory.status in ("ok", "truncated"), trajectory.error
        for turn in trajectory.turns:
            assert turn.prompt_ids and turn.completion_ids and len(turn.completion_ids) <= 12
            assert len(turn.logprobs or []) == len(turn.completion_ids)
    wrong = agentgym_here(
        "eval", "calculator", "--policy", "vllm", *served, "--model", "not-served",
        "--out", str(tmp_path / "x"),
    )  # fmt: skip
    assert wrong.returncode == 2 and "not 'not-served'" in wrong.stderr, wrong.stderr
