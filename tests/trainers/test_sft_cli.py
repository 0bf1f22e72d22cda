"""``agentgym sft`` on the tiny model and the calculator env.

The console script runs for real where its process is what is tested (exit codes, one-line
refusals, a kill); the runs that check what SFT trains and says run in this process
(`agentgym_here`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import agentgym
from agentgym import ScriptedPolicy, write_jsonl
from tests.conftest import agentgym_here, require

AGENTGYM = Path(sys.executable).parent / "agentgym"
ENV_ARG = ["--env-arg", "num_tasks=24"]
#: For runs that check what SFT reads, keeps, drops and says, not what it learns: two steps (a
#: first and a last loss, a history record each) of one trace each (2 traces' work, not 12).
FAST = ["--steps", "2", "--batch-size", "1", *ENV_ARG]
GOOD_TASKS, BAD_TASKS = [0, 1, 2, 3, 4, 5], [6, 7, 8, 9]


def agentgym_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb",
           "AGENTGYM_RUNS_DB": "off"}  # fmt: skip
    return subprocess.run(
        [str(AGENTGYM), *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def wrong_answer(task: dict) -> list[str]:
    """The oracle's tool call, then a wrong final answer: an ok episode with reward 0."""
    return [*agentgym.make("calculator").reference_turns(task)[:1], "The answer is -123456."]


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Calculator episodes: 6 solved by the oracle, 4 answered wrong (reward 0)."""
    kwargs = {"num_tasks": 24}
    oracle = agentgym.make("calculator", **kwargs).reference_turns
    played = agentgym.rollout("calculator", ScriptedPolicy(oracle), tasks=GOOD_TASKS,
                              env_kwargs=kwargs)  # fmt: skip
    played += agentgym.rollout("calculator", ScriptedPolicy(wrong_answer), tasks=BAD_TASKS,
                               env_kwargs=kwargs)  # fmt: skip
    assert [t.final_reward > 0 for t in played] == [True] * 6 + [False] * 4
    path = tmp_path_factory.mktemp("recorded") / "trajectories.jsonl"
    write_jsonl(played, path)
    return path


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_sft_on_the_env_scripts_trains_and_says_where(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "sft"
    done = agentgym_here("sft", tiny_model_dir, out, "--env", "calculator", "--tasks", "0:12",
                         *FAST)  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "sft.json").read_text())
    assert summary["source"]["kind"] == "env"
    assert summary["source"]["env_id"] == "agentgym/Calculator-v0"
    assert summary["source"]["scripts"] == {"reference": 1.0}
    assert summary["num_examples"] == 12 and len(summary["history"]) == 2
    base, trained = weights(tiny_model_dir), weights(out)
    assert any(not base[name].equal(trained[name]) for name in base)
    for line in ("traces used: 12", "first loss: ", "last loss: ", f"output folder: {out}"):
        assert line in done.stdout, done.stdout
    assert f"agentgym eval calculator --policy vllm --model-path {out}" in done.stdout  # as given


def test_sft_with_a_target_measures_held_out_traces_and_says_when_it_fell_short(
    tiny_model_dir: Path, tmp_path: Path
):
    """The train stage's warm start rule on the command: the last 128 of --tasks validate."""
    out = tmp_path / "sft"
    done = agentgym_here("sft", tiny_model_dir, out, "--env", "calculator", "--env-arg",
                         "num_tasks=140", "--tasks", "0:140", "--steps", "20", "--batch-size",
                         "1", "--target-accuracy", "1.0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "sft.json").read_text())
    assert summary["num_examples"] == 12  # 140 tasks, the last 128 held out
    assert summary["config"]["target_accuracy"] == 1.0
    measured = [r["step"] for r in summary["history"] if "reference_accuracy" in r]
    assert measured == [10, 20]  # every SFT_EVAL_EVERY steps
    assert "validation traces carried out: " in done.stdout and "(target 100%)" in done.stdout
    assert "health [warm-start-short] the warm start stopped short of its target: all 20 SFT " \
        "steps run" in done.stdout  # fmt: skip
    doctor = agentgym_here("runs", "doctor", out)
    assert doctor.returncode == 1 and "[warm-start-short]" in doctor.stdout, doctor.stderr


def test_sft_on_trajectories_keeps_the_rewarded_episodes(
    tiny_model_dir: Path, trajectories: Path, tmp_path: Path
):
    out = tmp_path / "sft"
    done = agentgym_here("sft", tiny_model_dir, out, "--trajectories", trajectories, *FAST)
    assert done.returncode == 0, done.stderr
    source = json.loads((out / "sft.json").read_text())["source"]
    assert source["kind"] == "trajectories"
    dropped = {"status": 0, "reward": 4}
    assert (source["read"], source["kept"], source["dropped"]) == (10, 6, dropped)
    file = source["files"][0]
    assert file["sha256"] == hashlib.sha256(trajectories.read_bytes()).hexdigest()
    assert "traces used: 6" in done.stdout

    everything = tmp_path / "all"
    done = agentgym_here("sft", tiny_model_dir, everything, "--trajectories", trajectories,
                         "--min-reward", "0", *FAST)  # fmt: skip
    assert done.returncode == 0, done.stderr
    source = json.loads((everything / "sft.json").read_text())["source"]
    assert (source["kept"], source["dropped"]["reward"]) == (10, 0)


def test_sft_on_trajectories_with_a_target_validates_on_the_last_tasks_episodes(
    tiny_model_dir: Path, tmp_path: Path
):
    """As with --env: the kept episodes of the last tasks (128 here) validate, never train."""
    kwargs = {"num_tasks": 140}
    oracle = agentgym.make("calculator", **kwargs).reference_turns
    played = agentgym.rollout("calculator", ScriptedPolicy(oracle), tasks=range(140),
                              env_kwargs=kwargs)  # fmt: skip
    recorded = tmp_path / "trajectories.jsonl"
    write_jsonl(played, recorded)
    out = tmp_path / "sft"
    done = agentgym_here("sft", tiny_model_dir, out, "--trajectories", recorded, "--steps", "20",
                         "--batch-size", "1", "--target-accuracy", "1.0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "sft.json").read_text())
    assert (summary["source"]["kept"], summary["source"]["validation"]) == (140, 128)
    assert summary["num_examples"] == 12
    measured = [r["step"] for r in summary["history"] if "reference_accuracy" in r]
    assert measured == [10, 20]
    assert "validation traces carried out: " in done.stdout and "(target 100%)" in done.stdout
    assert "health [warm-start-short]" in done.stdout


def test_the_held_out_episodes_are_whole_tasks_from_the_end() -> None:
    from agentgym.trainers._recorded_episodes import _split_by_task

    base = agentgym.rollout("calculator", ScriptedPolicy(["The answer is 1."]), tasks=[0])[0]
    tasks = [0, 0, 1, 1, 1, 2, 2, None, None]  # two inline tasks (no index) at the end
    episodes = [dataclasses.replace(base, task_index=t, group_index=g) for g, t in
                enumerate(tasks)]  # fmt: skip
    index = [(e.task_index, e.group_index) for e in episodes]

    def split(hold_out: int) -> tuple[list, list]:
        train, validation = _split_by_task(episodes, hold_out)
        return [(e.task_index, e.group_index) for e in train], \
            [(e.task_index, e.group_index) for e in validation]  # fmt: skip

    assert split(0) == (index, [])
    assert split(1) == (index[:8], index[8:])  # an inline task is a task of its own
    assert split(3) == (index[:5], index[5:])  # task 2 whole: 4 held out, not 3
    assert split(5) == (index[:2], index[2:])  # task 1 whole
    assert split(20) == ([], index)


def _other_env(trajectories: Path, tmp_path: Path) -> Path:
    """The same file with one episode claiming another env."""
    episodes = list(agentgym.read_jsonl(trajectories))
    episodes[0] = dataclasses.replace(episodes[0], env_id="agentgym/Other-v0")
    path = tmp_path / "mixed.jsonl"
    write_jsonl(episodes, path)
    return path


def _torn(trajectories: Path, tmp_path: Path) -> Path:
    """Two good lines, then one that is not JSON (line 3)."""
    lines = trajectories.read_text().splitlines(keepends=True)
    path = tmp_path / "torn.jsonl"
    path.write_text("".join(lines[:2]) + '{"env_id": "calculator", \n')
    return path


def _only_failures(trajectories: Path, tmp_path: Path) -> Path:
    episodes = [t for t in agentgym.read_jsonl(trajectories) if not t.final_reward]
    episodes[0] = dataclasses.replace(episodes[0], status="error")
    path = tmp_path / "failures.jsonl"
    write_jsonl(episodes, path)
    return path


@pytest.mark.parametrize(
    ("make_args", "expected"),
    [
        (lambda t, d: ["--trajectories", d / "missing.jsonl"], r"missing\.jsonl: no such file"),
        (
            lambda t, d: ["--trajectories", _torn(t, d)],
            r"line 3 of \S*torn\.jsonl is not a trajectory \(not JSON",
        ),
        (
            lambda t, d: ["--trajectories", _only_failures(t, d)],
            r"no episode kept: read 4, dropped 1 whose status is not ok and 3 with "
            r"final_reward <= 0; .*--min-reward",
        ),
        (
            lambda t, d: ["--trajectories", _other_env(t, d)],
            r"2 envs \(agentgym/Calculator-v0, agentgym/Other-v0\).*one env_id",
        ),
        (
            lambda t, d: ["--trajectories", t, "--env", "calculator"],
            r"both of --env and --trajectories; give exactly one",
        ),
        (lambda t, d: [], r"neither of --env and --trajectories"),
        (
            lambda t, d: ["--trajectories", t, "--target-accuracy", "0.9"],
            r"--target-accuracy holds back 128 kept episodes \(whole tasks\) for validation and "
            r"6 were kept; record more episodes",
        ),
        (
            lambda t, d: ["--env", "calculator", "--tasks", "0:12", "--target-accuracy", "0.9"],
            r"holds back the last 128 of --tasks for validation and there are 12; give --tasks "
            r"more than 128",
        ),
        (lambda t, d: ["--env", "calculater"], r"unknown env 'calculater'.*calculator"),
        # the knobs are named as the options that set them, not as SFTConfig's fields
        (lambda t, d: ["--env", "calculator", "--batch-size", "0"], r"^error: --batch-size must "
         r"be >= 1, got 0$"),  # fmt: skip
        (lambda t, d: ["--env", "calculator", "--device", "tpu"], r"--device must be cpu, cuda or "
         r"cuda:N"),  # fmt: skip
        (lambda t, d: ["--env", "calculator", "--max-length", "10"], r"over the --max-length "
         r"\(10\); raise it to \d+ or more"),  # fmt: skip
        # a device torch does not have here: refused before the weights load (was a traceback)
        (lambda t, d: ["--env", "calculator", "--device", "cuda:7"], r"device 'cuda:7', but torch "
         r"\S+ sees \d cuda device\(s\) on this machine; train on cpu"),  # fmt: skip
    ],
    ids=["missing", "not-json", "none-kept", "two-envs", "both", "neither", "target-few-episodes",
         "target-few-tasks", "unknown-env", "option-named", "bad-device", "max-length",
         "absent-device"],
)
def test_mistakes_are_one_line_and_write_nothing(
    make_args, expected: str, trajectories: Path, tmp_path: Path
):
    require("transformers")
    out = tmp_path / "out"
    line = one_error_line(agentgym_cli("sft", "tiny", out, *make_args(trajectories, tmp_path)))
    assert re.search(expected, line), line
    assert not out.exists()


def test_an_out_folder_in_use_is_refused(trajectories: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    line = one_error_line(agentgym_cli("sft", "tiny", out, "--trajectories", trajectories))
    assert "already exists and is not empty; pick a new folder" in line
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_model_without_a_chat_template_is_refused_before_it_loads(
    tiny_model_dir: Path, trajectories: Path, tmp_path: Path
):
    model = tmp_path / "plain"
    shutil.copytree(tiny_model_dir, model)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        path = model / name
        if name.endswith(".json") and path.exists():
            config = json.loads(path.read_text())
            config.pop("chat_template", None)
            path.write_text(json.dumps(config))
        elif path.exists():
            path.unlink()
    out = tmp_path / "out"
    line = one_error_line(agentgym_cli("sft", model, out, "--trajectories", trajectories))
    assert "no chat template" in line
    assert not out.exists()


def test_a_killed_sft_run_again_resumes_from_its_checkpoint_to_the_same_weights(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A kill mid-SFT lost every step: the warm start is most of the quickstart's minutes."""
    steps = 20  # the kill lands at the first checkpoint (step 2): 18 steps left to land in
    args = ["--env", "calculator", "--tasks", "0:12", "--steps", str(steps), "--batch-size",
            "4", "--save-every", "2", *ENV_ARG]  # fmt: skip
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    partial = tmp_path / "killed.partial" / "state.pt"
    env = {**os.environ, "NO_COLOR": "1"}
    command = [str(AGENTGYM), "sft", str(tiny_model_dir), str(killed), *args]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        while not partial.exists():  # the first checkpoint, then kill -9 at once
            assert proc.poll() is None, "the run ended before its first checkpoint"
            time.sleep(0.01)
    finally:
        proc.kill()
    assert proc.wait() == -9 and not killed.exists()
    resumed = agentgym_cli("sft", tiny_model_dir, killed, *args)
    assert resumed.returncode == 0, resumed.stderr
    said = re.search(r"sft resumed from .*state\.pt at step (\d+)", resumed.stdout)
    assert said, resumed.stdout
    step = int(said[1])
    assert 2 <= step < steps and not partial.parent.exists()  # removed once the model is saved
    assert agentgym_cli("sft", tiny_model_dir, straight, *args).returncode == 0
    a, b = weights(killed), weights(straight)
    assert all(a[name].equal(b[name]) for name in b)  # bit-identical: same data order
    history = json.loads((killed / "sft.json").read_text())["history"]
    assert [r["step"] for r in history] == list(range(1, steps + 1))
    assert [r["loss"] for r in history] == [
        r["loss"] for r in json.loads((straight / "sft.json").read_text())["history"]
    ]
    # the time goes on from the killed run's (it restarted at 0, and the total left it out)
    seconds = [r["seconds"] for r in history]
    assert seconds == sorted(seconds) and seconds[step] > seconds[step - 1] > 0
    assert json.loads((killed / "sft.json").read_text())["seconds"] > seconds[-1]


def record(folder: Path, system_prompt: str) -> Path:
    """Six oracle episodes recorded by `agentgym eval` under a system prompt of its own."""
    options = ["--env-arg", "num_tasks=24", "--env-arg", f"system_prompt={system_prompt}"]
    played = agentgym_here("eval", "calculator", "--policy", "reference", "--tasks", "0:6",
                           *options, "--out", folder)  # fmt: skip
    assert played.returncode == 0, played.stderr
    return folder / "trajectories.jsonl"


def test_an_evals_episodes_train_and_evaluate_under_the_settings_they_were_played_with(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The eval's env options were dropped: SFT built the default env, and the hint evaluated
    the model under another system prompt than the one every trace carries. (What is checked
    is the settings read and said, not the training: a step of one trace each.)"""
    recorded = record(tmp_path / "record", "Be brief.")
    out = tmp_path / "sft"
    done = agentgym_here("sft", tiny_model_dir, out, "--trajectories", recorded,
                         "--steps", "1", "--batch-size", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    source = json.loads((out / "sft.json").read_text())["source"]
    assert source["env_kwargs"] == {"num_tasks": 24, "system_prompt": "Be brief."}
    assert "--env-arg num_tasks=24 --env-arg 'system_prompt=Be brief.'" in done.stdout
    given = agentgym_here("sft", tiny_model_dir, tmp_path / "given", "--trajectories", recorded,
                          "--steps", "1", "--batch-size", "1", "--env-arg",
                          "num_tasks=30")  # fmt: skip
    assert given.returncode == 0, given.stderr  # a given option wins over the recorded one
    assert "--env-arg num_tasks=30 --env-arg 'system_prompt=Be brief.'" in given.stdout
    other = record(tmp_path / "other", "Be thorough.")
    mixed = agentgym_cli("sft", tiny_model_dir, tmp_path / "mixed", "--trajectories", recorded,
                         "--trajectories", other, "--steps", "1")  # fmt: skip
    assert "played with different env options" in one_error_line(mixed)


def test_the_same_episodes_in_another_order_train_the_same_model(
    tiny_model_dir: Path, tmp_path: Path, trajectories: Path
) -> None:
    """An eval writes episodes as they finish: two recordings of the same episodes trained two
    models (held out, 66% against 100% for the same quickstart distillation)."""
    lines = trajectories.read_text().splitlines()
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("\n".join(reversed(lines)) + "\n")
    for source, out in ((trajectories, "a"), (shuffled, "b")):
        done = agentgym_here("sft", tiny_model_dir, tmp_path / out, "--trajectories", source,
                             "--steps", "2", "--batch-size", "2", *ENV_ARG)  # fmt: skip
        assert done.returncode == 0, done.stderr
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(a[name].equal(b[name]) for name in a)
