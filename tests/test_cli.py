"""The ``agentgym`` console script.

Run for real in a subprocess where its process is what is tested: the exit code reaching the
shell, a refusal's only stderr line (with every warning the process prints), a table at the
terminal's width. A command tested for the files it writes runs in the test's process
(`agentgym_here`), without a new process's seconds of imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym import ConfigError, read_jsonl
from tests.conftest import agentgym_here

AGENTGYM = Path(sys.executable).parent / "agentgym"


def run(
    *args: str, cwd: Path | None = None, env_vars: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb", **(env_vars or {})}
    return subprocess.run(
        [str(AGENTGYM), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_console_script_installed() -> None:
    assert AGENTGYM.exists(), f"no console script at {AGENTGYM}"


def test_list_shows_calculator() -> None:
    proc = run("list")
    assert proc.returncode == 0, proc.stderr
    assert "agentgym/Calculator-v0" in proc.stdout
    assert "calculate" in proc.stdout and "100" in proc.stdout


def test_list_keeps_ids_and_tool_names_whole_in_a_narrow_terminal() -> None:
    """At 80 columns rich cut ids to ``agentgym/Calculator-…``: the one thing users copy."""
    proc = run("list", env_vars={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert max(map(len, proc.stdout.splitlines())) <= 80
    assert "…" not in proc.stdout, proc.stdout
    assert "agentgym/Calculator-v0" in proc.stdout and "``" not in proc.stdout


def test_check_calculator_passes() -> None:
    proc = run("check", "calculator")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("gymnasium check_env", "tool schemas", "parser round trip", "reference episode"):
        assert name in proc.stdout
    assert "FAIL" not in proc.stdout and proc.stdout.count("pass") >= 4


NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


@pytest.mark.parametrize(
    ("args", "env_vars", "code"),
    [
        pytest.param(["--help"], {}, 0, id="help"),
        pytest.param([], {}, 2, id="no-command"),
        pytest.param(["evaluate"], {}, 2, id="unknown-command"),
        pytest.param(["sandbox", "ls"], NO_DOCKER, 75, id="sandbox-ls-without-docker"),
        pytest.param(["sandbox", "ls", "--host", "tcp://10.0.0.5:2376", "--cert-dir", "/missing"],
                     {}, 2, id="sandbox-ls-bad-cert-dir"),  # a config error, as elsewhere
        pytest.param(["sandbox", "build", "--method", "magic"], {}, 2, id="sandbox-bad-option"),
        pytest.param(["sandbox", "bench", "--n", "many"], {}, 2, id="sandbox-bench-bad-value"),
    ],
)  # fmt: skip
def test_exit_code_of_each_verb(args: list[str], env_vars: dict[str, str], code: int) -> None:
    """The installed script's code reaches the shell (`main` once dropped the app's code)."""
    proc = run(*args, env_vars=env_vars)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_failed_check_row_exits_1_after_printing_the_table() -> None:
    proc = run("check", "calculator", "--env-arg", "max_turns=1")
    assert proc.returncode == 1
    assert "reference episode" in proc.stdout and "FAIL" in proc.stdout


CHECKED_ENVS = """
import agentgym

def boom(completion: str) -> float:
    raise ValueError("reward exploded")

class NoReference(agentgym.ToolEnv):
    def __init__(self, **kwargs):
        super().__init__([], tasks=[{"prompt": "hi"}], **kwargs)

class RaisingReward(NoReference):
    def __init__(self, **kwargs):
        super().__init__(rubric=agentgym.Rubric([boom]), **kwargs)

    def reference_turns(self, task):
        return ["hello"]

agentgym.register("checked/NoReference-v0", NoReference)
agentgym.register("checked/RaisingReward-v0", RaisingReward)
"""


def test_check_shows_a_skip_as_skip_and_a_failure_s_traceback_below_the_table(
    tmp_path: Path,
) -> None:
    (tmp_path / "checked.py").write_text(CHECKED_ENVS)
    skipped = run("check", "checked:checked/NoReference-v0", cwd=tmp_path)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    row = next(line for line in skipped.stdout.splitlines() if "reference episode" in line)
    assert "skip" in row and "pass" not in row, skipped.stdout
    failed = run("check", "checked:checked/RaisingReward-v0", cwd=tmp_path)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    table, _, below = failed.stdout.partition("traceback of reference episode:")
    assert "reward function 'boom' raised ValueError: reward exploded" in table
    assert "Traceback (most recent call last)" in below and 'raise ValueError("reward' in below


@pytest.mark.slow
def test_eval_writes_trajectories_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = agentgym_here("eval", "calculator", "-n", "5", "-g", "2", "--out", out)
    assert proc.returncode == 0, proc.stderr
    trajectories = list(read_jsonl(out / "trajectories.jsonl"))
    assert len(trajectories) == 10
    # streamed as episodes finish: every planned episode once, in whatever order they ended
    assert sorted(t.key for t in trajectories) == [(i, g) for i in range(5) for g in range(2)]
    assert sorted(t.task_index for t in trajectories) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert all(t.status == "ok" for t in trajectories)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward/mean"] == 1.0
    assert summary["episodes"] == 10 and summary["status"]["ok"] == 10
    assert summary["env"] == "agentgym/Calculator-v0" and summary["policy"] == "reference"
    written = sorted(p.name for p in out.iterdir())
    assert written == ["run.json", "summary.json", "trajectories.jsonl"]
    assert "reward/mean" in proc.stdout


THINK_OFF = '{"enable_thinking": false}'


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["eval", "calculater"], "Did you mean 'calculator'", id="eval-unknown-env"),
        pytest.param(["check", "calculater"], "Did you mean 'calculator'", id="check-unknown-env"),
        pytest.param(["eval", "calculator", "--env-arg", "bogus=1"], "bogus", id="unknown-env-arg"),
        pytest.param(["eval", "calculator", "--env-arg", "novalue"], "key=value",
                     id="malformed-env-arg"),
        pytest.param(["eval", "calculator", "--policy", "openai"], "--model",
                     id="openai-without-model"),
        pytest.param(["eval", "calculator", "--policy", "vllm"], "--model-path",
                     id="vllm-without-model-path"),
        pytest.param(["eval", "calculator", "--policy", "vllm", "--model-path", "/"],
                     "not a model folder", id="vllm-model-path-not-a-model"),
        pytest.param(["eval", "calculator", "--chat-template-kwargs", THINK_OFF],
                     "--chat-template-kwargs applies to --policy vllm or hf, not reference",
                     id="template-kwargs-without-vllm"),
        pytest.param(["eval", "calculator", "--policy", "hf"], "--policy hf needs --model-path",
                     id="hf-without-model-path"),
        pytest.param(["eval", "calculator", "--policy", "vllm", "--model-path", "/",
                      "--rollout-mode", "sometimes"], "--rollout-mode", id="bad-rollout-mode"),
        pytest.param(["check", "calculator", "--chat-template-kwargs", THINK_OFF],
                     "--model DIR", id="check-template-kwargs-without-model"),
        pytest.param(["eval", "calculator", "--adapter", "/"], "--policy vllm or hf",
                     id="adapter-without-a-local-policy"),
        pytest.param(["eval", "calculator", "--policy", "hf", "--adapter", "/"],
                     "not a LoRA adapter", id="adapter-not-an-adapter"),
        pytest.param(["eval", "calculator", "-n", "1", "-g", "0"], "--group-size",
                     id="zero-group-size"),
        pytest.param(["eval", "calculator", "-n", "1", "--concurrency", "0"], "--concurrency",
                     id="zero-concurrency"),
        pytest.param(["eval", "calculator", "--policy", "openai", "--model", "m", "--base-url",
                      "127.0.0.1:8000/v1"], "base_url (--base-url) must be an http(s) URL",
                     id="base-url-without-scheme"),
    ],
)  # fmt: skip
def test_user_errors_exit_2_with_one_line_and_write_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "out"
    proc = run(*args, "--out", str(out)) if args[0] == "eval" else run(*args)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert message in line and line.startswith("error:")
    assert not out.exists()


def test_usage_error_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # nothing is written where the user stands
    proc = agentgym_here("eval", "calculator", "--group-size", "many")
    assert proc.returncode == 2
    assert "--group-size" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_eval_refuses_to_mix_into_an_existing_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert agentgym_here("eval", "calculator", "-n", "2", "--out", out).returncode == 0
    before = (out / "trajectories.jsonl").read_bytes()
    proc = run("eval", "calculator", "-n", "2", "--out", str(out))
    assert proc.returncode == 2 and "--resume" in one_error_line(proc)
    proc = run("eval", "calculator", "-n", "2", "-g", "3", "--out", str(out), "--resume")
    assert proc.returncode == 2 and "group_size" in one_error_line(proc)
    assert (out / "trajectories.jsonl").read_bytes() == before


def test_an_eval_whose_every_episode_the_backend_failed_exits_as_infra(tmp_path: Path) -> None:
    # nothing listens on the discard port: every turn is a ModelError, every episode infra_error
    dead = ["--policy", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    proc = run("eval", "calculator", "-n", "2", *dead, "--out", str(tmp_path / "run"))
    assert proc.returncode == 75, proc.stderr  # EXIT_INFRA: a queue retries it (was 0)
    assert "all 2 episodes played ended in infra_error" in proc.stderr
    assert "the first: agentgym._errors.ModelError: http://127.0.0.1:9/v1" in proc.stderr  # why
    statuses = [t.status for t in read_jsonl(tmp_path / "run" / "trajectories.jsonl")]
    assert statuses == ["infra_error"] * 2  # kept, for --resume to play again


def test_an_opening_prompt_over_the_context_is_refused_before_the_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # every episode would end truncated with no turn (ToolAPI's 12 schemas passed 4,096)
    args = ["--policy", "hf", "--model-path", str(tiny_model_dir), "-n", "1"]
    proc = run("eval", "calculator", *args, "--max-model-len", "64", "--out", str(tmp_path / "a"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    [message] = [line for line in proc.stderr.splitlines() if line.strip()]  # no weights load
    assert message.startswith("error: the env's opening prompt is") and "--max-model-len" in message
    assert not (tmp_path / "a" / "trajectories.jsonl").exists()  # nothing was played


def test_the_context_window_fits_the_model_by_default_and_a_longer_one_is_refused(
    tmp_path: Path,
) -> None:
    # a model of 1,024 positions (the quickstart's): vLLM refused the 4,096 default at engine
    # start, reported as an infrastructure failure (exit 75) that queues retry
    from agentgym.engine import HFPolicy
    from agentgym.engine.tiny import build_tiny_model

    short = build_tiny_model(max_position_embeddings=1024)
    assert HFPolicy(short).max_model_len == 1024
    args = ["--policy", "hf", "--model-path", str(short), "-n", "1"]
    proc = run("eval", "calculator", *args, "--max-model-len", "2048", "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    message = one_error_line(proc)
    assert "max_model_len=2048 exceeds" in message and "max_position_embeddings=1024" in message
    assert "lower max_model_len to 1024" in message


def test_resume_plays_again_the_episodes_the_backend_failed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert agentgym_here("eval", "calculator", "-n", "3", "--out", out).returncode == 0
    results = out / "trajectories.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    failed = json.loads(lines[1]) | {"status": "infra_error", "turns": []}
    results.write_text(lines[0] + json.dumps(failed) + "\n" + lines[2])
    proc = agentgym_here("eval", "calculator", "-n", "3", "--out", out, "--resume")
    assert proc.returncode == 0, proc.stderr
    resumed = list(read_jsonl(results))
    assert [t.status for t in resumed] == ["ok"] * 3  # the failed one replayed, not kept
    assert sorted(t.task_index for t in resumed) == [0, 1, 2]


def test_resume_plays_only_missing_episodes_after_a_torn_write(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert agentgym_here("eval", "calculator", "-n", "4", "-g", "2", "--out", out).returncode == 0
    results = out / "trajectories.jsonl"
    full = list(read_jsonl(results))
    lines = results.read_bytes().splitlines(keepends=True)
    # as if killed mid-write: 3 whole episodes, then half of the 4th line
    results.write_bytes(b"".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    proc = agentgym_here("eval", "calculator", "-n", "4", "-g", "2", "--out", out, "--resume")
    assert proc.returncode == 0, proc.stderr
    resumed = list(read_jsonl(results))
    assert len(resumed) == 8
    key = lambda t: (t.task_index, t.group_index)  # noqa: E731
    assert sorted(map(key, resumed)) == sorted(map(key, full))
    assert {key(t): t.seed for t in resumed} == {key(t): t.seed for t in full}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 8 and summary["reward/mean"] == 1.0


@pytest.mark.parametrize(
    ("pair", "value"),
    [
        ("tool_timeout=None", None), ("flag=True", True), ("flag=False", False),
        ("tool_timeout=null", None), ("flag=true", True), ("tool_timeout=2.5", 2.5),
        ('name="None"', "None"), ("name=none", "none"), ("name=Nonesuch", "Nonesuch"),
        ("prompt=Use the tool.", "Use the tool."), ("seq=[1, 2]", [1, 2]), ("empty=", ""),
    ],
)  # fmt: skip
def test_env_args_read_json_and_python_constants_else_a_string(pair: str, value: object) -> None:
    """``tool_timeout=None`` was the string 'None', refused as "input should be a valid number"."""
    from agentgym._cli_common import parse_env_args

    key = pair.partition("=")[0]
    assert parse_env_args([pair]) == {key: value}


def test_eval_takes_an_env_arg_of_none(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = agentgym_here("eval", "calculator", "-n", "1", "--env-arg", "tool_timeout=None",
                         "--out", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "run.json").read_text())["env_kwargs"] == {"tool_timeout": None}
    assert [t.status for t in read_jsonl(out / "trajectories.jsonl")] == ["ok"]


def test_a_trl_key_in_a_train_config_names_what_to_set_in_one_sentence(tmp_path: Path) -> None:
    config = tmp_path / "grpo.yaml"
    config.write_text("model: tiny\nenv: calculator\nmax_prompt_length: 512\n")
    proc = run("train", str(config), "--dry-run")
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc) == (
        "error: unknown config key 'max_prompt_length'; it is TRL's; here prompts grow with "
        "every turn: set max_episode_tokens (sampled tokens per episode) and max_model_len "
        "(the context)"
    )


@pytest.mark.parametrize(
    ("peft_config", "rank"),
    [({"r": 16}, 16), ({"r": 4}, 8), ({"r": 4, "rank_pattern": {"q_proj": 24}}, 32)],
)
def test_an_adapter_is_served_at_the_smallest_rank_holding_its_largest(
    tmp_path: Path, peft_config: dict, rank: int
) -> None:
    from agentgym._eval_engine import lora_options

    (tmp_path / "adapter_config.json").write_text(json.dumps(peft_config))
    assert lora_options(tmp_path)["max_lora_rank"] == rank
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 1024}))
    with pytest.raises(ConfigError, match="rank 1024; vLLM serves at most 512"):
        lora_options(tmp_path)


def test_eval_builds_the_tiny_model_a_run_names_as_train_does(tmp_path: Path) -> None:
    # `model: tiny:quickstart` trains; the same name was "not a model folder" to eval
    from agentgym.engine.tiny import build_preset

    args = ["--policy", "hf", "--model-path", "tiny:test", "--seed", "3", "-n", "1"]
    proc = agentgym_here("eval", "calculator", *args, "--max-tokens", "4", "--out", tmp_path / "a")
    assert proc.returncode == 0, proc.stderr
    played = json.loads((tmp_path / "a" / "run.json").read_text())["model"]
    assert played == str(build_preset("test", seed=3))  # the seed's model, as train builds it
    proc = run("eval", "calculator", "--policy", "hf", "--model-path", "tiny:nope",
               "--out", str(tmp_path / "b"))  # fmt: skip
    assert proc.returncode == 2
    refused = "unknown tiny model preset 'nope'; presets: ['quickstart', 'test']"
    assert refused in one_error_line(proc)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path: Path, below: str) -> None:
    # it failed at the run's first write, after the env (and a model) loaded, with a traceback
    (tmp_path / "notes.txt").write_text("mine")
    proc = run("eval", "calculator", "--out", str(tmp_path / "notes.txt" / below))
    assert proc.returncode == 2
    assert "notes.txt is a file, not a folder; choose another --out" in one_error_line(proc)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_an_out_no_folder_can_be_made_in_is_one_line() -> None:
    """Under /proc: root passes the up-front write check, then mkdir failed with a traceback."""
    proc = run("eval", "calculator", "--policy", "reference", "-n", "1",
               "--out", "/proc/agentgym-eval-out")  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = one_error_line(proc)
    assert line.startswith("error: Invalid value for '--out': /proc/agentgym-eval-out is under "
                           "/proc, the kernel's own file system")  # fmt: skip
    assert line.endswith("give a folder on a disk")
