"""A user moves off the quickstart to Mistral-v0.3-, Llama-3.1- and DeepSeek-V3.1-shaped models and
walks each through `agentgym check`, `agentgym train` (dry run, then SFT warm start + GRPO on
vLLM-CPU) and `agentgym eval` of the result, through the CLI's own code, in this process
(`agentgym_here`): the commands' work and output are tested, not the console script's process.

Mistral v0.3: the system prompt is shown only while the user message is last (so ``per_turn``),
tool-call ids must be 9 letters and digits, calls are ``[TOOL_CALLS] [{..., "id": ...}]``.
Llama 3.1: the template drops the text before a call and writes ``{"name", "parameters"}``
(``concat``: the sampled tokens are kept). Neither template lists tools, so the env does
(``tool_prompt: system``). The tiny model imitates the oracle's format only roughly after a
short warm start, so each property below is checked on what the model did write. The Mistral
shape trains (ids, ``per_turn``: what the quickstart never exercises), and so does a DeepSeek
V3.1 shape (``concat`` under its own parser, calls between markers the tiny vocabulary spells
out byte by byte, arguments written as text); the Llama shape is checked and dry-run (a
``concat`` run like the quickstart's, under another parser).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

import agentgym
from agentgym._env import json_copy
from agentgym.parsers import get_parser
from agentgym.trainers._run_dir import read_jsonl_records
from tests.conftest import TINY_RUN, agentgym_ok, model_with_template, require
from tests.test_check_families import DEEPSEEK_V31_LIKE, LLAMA31_LIKE, MISTRAL_V03_LIKE

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]

#: family -> (template, parser, the mode `agentgym check` reports for it)
FAMILIES = {
    "mistral": (MISTRAL_V03_LIKE, "mistral", "per_turn"),
    "llama": (LLAMA31_LIKE, "llama3_json", "concat"),
    "deepseek": (DEEPSEEK_V31_LIKE, "deepseek_v31", "concat"),
}
#: Two tasks x G=2 for two steps after a short warm start on the oracle's episodes; evals on
#: three held-out tasks. A Mistral call turn is ~100 byte tokens, so 128 a turn.
RUN = {
    **TINY_RUN,
    "eval_tasks": "0:3",
    "max_turns": 3, "max_completion_length": 128,
    "sft_scripts": {"reference": 1.0}, "sft_steps": 30, "sft_learning_rate": 5e-3,
    "sft_batch_size": 8, "sft_num_traces": 16,
    "max_steps": 2, "save_steps": 2, "eval_steps": None,
}  # fmt: skip
CALL_ID = re.compile(r"[A-Za-z0-9]{9}")
#: The families trained for real (each run costs about a minute and a half here).
TRAINED = ["mistral", "deepseek"]
#: How a trained family's call turn opens, as far as 30 warm-start steps teach the tiny model
#: (it wrote ``<｜tol▁cal▁...`` for the 28 bytes of ``<｜tool▁calls▁begin｜>``).
OPENINGS = {"mistral": "[TOOL_", "deepseek": "<｜t"}


def check_in_process(model: Path, parser: str) -> Result:
    """``agentgym check calculator --model MODEL`` with the family's parser, in this process."""
    from agentgym.cli import app

    return CliRunner().invoke(
        app, ["check", "calculator", "--model", str(model), "--env-arg", f"parser={parser}",
              "--env-arg", "tool_prompt=system"],
        env={"COLUMNS": "400", "NO_COLOR": "1"},
    )  # fmt: skip


def env_kwargs(parser: str) -> dict[str, Any]:
    return {"num_tasks": 40, "parser": parser, "tool_prompt": "system"}


@pytest.fixture(scope="module")
def models(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model with each family's template (in tokenizer_config.json, as they ship)."""
    root = tmp_path_factory.mktemp("family_models")
    return {name: model_with_template(tiny_model_dir, template, root / name)
            for name, (template, _, _) in FAMILIES.items()}  # fmt: skip


@pytest.fixture(scope="module")
def runs(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per family: `check`, the dry run, then the real `agentgym train` (one run shared)."""
    require("vllm")
    configs: dict[str, Path] = {}
    for name, (_, parser, _) in FAMILIES.items():
        folder = tmp_path_factory.mktemp(f"{name}_run")
        configs[name] = folder / "run.yaml"
        configs[name].write_text(yaml.safe_dump({**RUN, "model": str(models[name]),
                                                 "env_kwargs": env_kwargs(parser),
                                                 "output_dir": str(folder / "run")}))  # fmt: skip
    # In this process, where the imports are done: the commands' own code and output (the
    # console script's process is `test_cli`'s); `agentgym_here` undoes the logging and
    # environment that `train` (even a dry run) sets.
    found: dict[str, Any] = {}
    for name, (_, parser, _) in FAMILIES.items():
        check = check_in_process(models[name], parser)
        dry = agentgym_ok("train", str(configs[name]), "--dry-run")
        run = configs[name].parent / "run"
        # dropped text before a call only warns
        assert check.exit_code == 0, check.output + repr(check.exception)
        assert not run.exists()  # a dry run writes nothing
        found[name] = {"check": check.stdout, "dry": dry.stdout, "run": run}
    for name in TRAINED:  # one at a time: vLLM-CPU pins every engine's worker to core 0
        agentgym_ok("train", str(configs[name]))
    return found


def final_evals(run: Path) -> list[dict[str, Any]]:
    return [t for t in read_jsonl_records(run / "eval_trajectories.jsonl")
            if t["info"].get("eval") == "final"]  # fmt: skip


@pytest.mark.parametrize("name", FAMILIES)
def test_check_dry_run_and_run_agree_on_the_mode(runs: dict[str, Any], name: str) -> None:
    mode = FAMILIES[name][2]
    run = runs[name]
    assert re.search(rf"rollout mode\s*│ pass\s*│ {mode}", run["check"]), run["check"]
    assert f"rollouts     {mode} mode" in run["dry"], run["dry"]
    if name not in TRAINED:
        return
    log = (run["run"] / "train.log").read_text()
    assert f"rollout mode {mode}" in log
    # one engine: the base eval's took the warm start's weights in place (that it then serves
    # them exactly: tests/engine/test_reload_weights.py)
    assert "the engine took the warm start's weights in place" in log
    played = read_jsonl_records(run["run"] / "eval_trajectories.jsonl")
    assert {t["info"]["eval"] for t in played} == {"base", "eval", "final"}  # eval: after SFT
    assert {t["mode"] for t in played} == {mode}  # base, warm-started and final evals alike


@pytest.mark.parametrize("name", TRAINED)
def test_the_run_ends_with_both_steps_and_its_warm_start(runs: dict[str, Any], name: str) -> None:
    run = runs[name]["run"]
    steps = [m for m in read_jsonl_records(run / "metrics.jsonl") if "data/tasks" in m]
    assert [m["step"] for m in steps] == [1, 2]
    episodes = RUN["tasks_per_step"] * RUN["num_generations"]
    per_turn = episodes if FAMILIES[name][2] == "per_turn" else 0
    for m in steps:
        assert m["rollout/per_turn_episodes"] == per_turn
        assert m["rollout/trained_tokens"] > 0 and m["rollout/tool_calls_per_episode"] >= 0
    warm = json.loads((run / "sft" / "sft.json").read_text())
    assert warm["history"][-1]["loss"] < warm["history"][0]["loss"] / 2  # the format was learnt
    assert "grpo/success" in (run / "summary.json").read_text()


@pytest.mark.parametrize("name", TRAINED)
def test_the_models_calls_are_parsed_and_counted(runs: dict[str, Any], name: str) -> None:
    """Each turn the model wrote, parsed with the family's parser, is what the env recorded,
    and the eval's tool-call count is those calls."""
    run = runs[name]["run"]
    parser = get_parser(FAMILIES[name][1])
    played = final_evals(run)
    calls = 0
    for trajectory in played:
        assistant = [m for m in trajectory["messages"] if m["role"] == "assistant"]
        assert len(assistant) == len(trajectory["turns"])
        for message, turn in zip(assistant, trajectory["turns"], strict=True):
            parsed = parser.parse(turn["text"])
            assert [c.name for c in parsed.tool_calls] == [
                c["function"]["name"] for c in message.get("tool_calls", [])
            ]
            calls += len(parsed.tool_calls)
    metrics = [m for m in read_jsonl_records(run / "metrics.jsonl") if "eval/success" in m]
    assert metrics[-1]["eval/tool_calls_per_episode"] == pytest.approx(calls / len(played))
    # the warm start taught the format: the model opens its first turn as the oracle does
    opening = OPENINGS.get(name, '{"name')
    assert any(t["turns"][0]["text"].startswith(opening) for t in played), [
        t["turns"][0]["text"][:40] for t in played
    ]


@pytest.mark.parametrize("name", TRAINED)
def test_each_turns_prompt_is_the_engines_fresh_prompt(
    runs: dict[str, Any], models: dict[str, Path], name: str
) -> None:
    """Under ``per_turn`` each turn's prompt is a fresh render of the history so far, so every
    id the env gave a call must be one the template accepts (Mistral: 9 letters and digits)."""
    from transformers import AutoTokenizer

    from agentgym._trajectory import Trajectory
    from agentgym.engine._render import policy_renderer
    from agentgym.trainers._samples import build_samples

    renderer = policy_renderer(AutoTokenizer.from_pretrained(models[name]), None)
    played = [Trajectory.from_dict(t) for t in final_evals(runs[name]["run"])]
    for trajectory in played:
        at = [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"]
        for turn, index in zip(trajectory.turns, at, strict=True):
            fresh = renderer.prompt_ids(trajectory.messages[:index], [])
            if trajectory.mode == "per_turn":
                assert turn.prompt_ids == fresh
        ids = [m["tool_call_id"] for m in trajectory.messages if m["role"] == "tool"]
        if name == "mistral":
            assert all(CALL_ID.fullmatch(i) for i in ids), ids
    samples = build_samples(played, [1.0] * len(played), "auto")
    for sample in samples:
        if sample.turn is not None:
            turn = played[sample.episode].turns[sample.turn]
            assert sample.input_ids == [*turn.prompt_ids, *turn.completion_ids]


def test_a_call_without_an_id_gets_one_the_mistral_template_renders(
    models: dict[str, Path],
) -> None:
    """The model writes no id (or a wrong one): the env's id must let the next prompt render."""
    from transformers import AutoTokenizer

    from agentgym.engine._render import policy_renderer

    renderer = policy_renderer(AutoTokenizer.from_pretrained(models["mistral"]), None)
    env = agentgym.make("calculator", **env_kwargs("mistral"))
    env.reset(options={"task": 0})
    call = '{"name": "calculate", "arguments": {"expression": "66 + 24"}'
    env.step(f'[TOOL_CALLS] [{call}, "id": "short"}}, {call}}}]')
    env.step("[TOOL_CALLS] [{broken")
    history = json_copy(env.messages)
    ids = [m["tool_call_id"] for m in history if m["role"] == "tool"]
    assert len(ids) == 3 and all(CALL_ID.fullmatch(i) for i in ids), ids
    assert len(set(ids)) == 3
    prompt = renderer.prompt_ids(history, [])
    assert renderer.tokenizer.decode(prompt).count("[TOOL_RESULTS]") == 3
    env.close()


def test_eval_of_the_trained_mistral_run_plays_as_the_run_did(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    done = agentgym_ok("eval", "calculator", "--policy", "vllm", "--adapter",
                       str(runs["mistral"]["run"]), "-n", "3", "--temperature", "0",
                       "--out", str(out))  # fmt: skip
    # the run's env options, not the defaults
    assert "'parser': 'mistral'" in done.stdout + done.stderr
    played = read_jsonl_records(out / "trajectories.jsonl")
    assert len(played) == 3 and {t["mode"] for t in played} == {"per_turn"}
    assert {t["status"] for t in played} <= {"ok", "truncated"}
    # greedy, as the run's evals: a fresh engine on the warm start's folder and the last adapter
    # writes, token for token, what the run's own engine wrote in its final eval, where that
    # engine had started on the base model and taken the warm start's weights in place
    ran = {t["task_index"]: t["turns"][0]["completion_ids"] for t in final_evals(
        runs["mistral"]["run"])}  # fmt: skip
    assert {t["task_index"]: t["turns"][0]["completion_ids"] for t in played} == ran
