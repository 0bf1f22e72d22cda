"""What `agentgym eval` refuses or reports instead of exiting 0 on a run that measured nothing.

Options of another ``--policy`` (``--model-path`` without ``--policy`` once evaluated the env's
reference answers as if they were the model's), an env without a reference solution under the
reference policy, a run whose every episode errored, and a Ctrl-C. Each run is the installed
console script in a subprocess, on a small env of this file's own (``faulty.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym import read_jsonl

AGENTGYM = Path(sys.executable).parent / "agentgym"
DEADLINE_S = 60.0

FAULTY_ENV = """
import asyncio

import agentgym


class Faulty(agentgym.ToolEnv):
    '''One task per kind in ``kinds``: 'ok' plays, 'broken' fails its setup, 'down' finds
    its service down (infrastructure), 'stuck' never gets past it.'''

    def __init__(self, kinds="ok", **kwargs):
        tasks = [{"prompt": f"task {i}", "kind": k} for i, k in enumerate(kinds.split(","))]
        super().__init__([], tasks=tasks, **kwargs)

    async def setup_episode(self, task):
        if task["kind"] == "broken":
            raise RuntimeError(f"{task['prompt']} is broken")
        if task["kind"] == "down":
            raise agentgym.InfraError(f"the service of {task['prompt']} is down")
        if task["kind"] == "stuck":
            await asyncio.Event().wait()

    def reference_turns(self, task):
        return ["done"]


class NoReference(agentgym.ToolEnv):
    '''The README's shape: ToolEnv's own reference_turns, which returns None.'''

    def __init__(self, **kwargs):
        super().__init__([], tasks=[{"prompt": "hi"}], **kwargs)


class Unbuildable(agentgym.ToolEnv):
    '''Its service is down: the constructor itself raises.'''

    def __init__(self, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")


agentgym.register("test/Faulty-v0", Faulty)
agentgym.register("test/NoReference-v0", NoReference)
agentgym.register("test/Unbuildable-v0", Unbuildable)
"""
FAULTY = "faulty:test/Faulty-v0"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "faulty.py").write_text(FAULTY_ENV)
    return tmp_path


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        **os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb",
        "AGENTGYM_RUNS_DB": "off", **(extra or {}),
    }  # fmt: skip


def run(
    workdir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTGYM), "eval", *args, "--out", str(workdir / "out")],
        cwd=workdir, env=_env(env), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line on stderr (after the progress bar), with no traceback anywhere."""
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.strip()][-1]


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0].removeprefix("error: ")


def test_an_env_whose_constructor_raises_is_one_line_naming_its_frame(workdir: Path) -> None:
    """It printed a full traceback through the CLI's internals (the user's service down)."""
    proc = run(workdir, "faulty:test/Unbuildable-v0", "-n", "1")
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert line.startswith("test/Unbuildable-v0 could not be built: ConnectionRefusedError")
    assert f"at {workdir / 'faulty.py'}:" in line and "agentgym.make(" in line


@pytest.mark.parametrize(
    "command",
    [["check", "faulty:test/Unbuildable-v0"],
     ["train", "config.yaml", "--dry-run"],
     ["sft", "tiny", "sft-out", "--env", "faulty:test/Unbuildable-v0", "--steps", "1"]],
    ids=["check", "train-dry-run", "sft"],
)  # fmt: skip
def test_every_command_names_the_frame_of_an_env_whose_constructor_raises(
    workdir: Path, command: list[str]
) -> None:
    """``eval`` said it in one line; ``check``, ``train --dry-run`` and ``sft`` printed some
    90 lines of rich traceback for the same env."""
    (workdir / "config.yaml").write_text("env: faulty:test/Unbuildable-v0\nreport_to: [none]\n")
    proc = subprocess.run([str(AGENTGYM), *command], cwd=workdir, env=_env(None),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    line = [text for text in proc.stderr.splitlines() if text.strip()][-1]
    assert "Traceback" not in proc.stderr and "─" not in proc.stderr, proc.stderr
    assert "test/Unbuildable-v0 could not be built: ConnectionRefusedError" in line


def test_a_sandbox_env_without_its_image_is_refused_before_any_episode(workdir: Path) -> None:
    """Every episode ended infra_error, after a model (if any) loaded, and the run went on."""
    proc = run(workdir, "pythoncode", "--policy", "reference", "-n", "1",
               "--env-arg", "image=agentgym-sandbox:no-such-tag")  # fmt: skip
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line.startswith("env 'agentgym/PythonCode-v0' runs code in Docker sandboxes: image ")
    assert "agentgym sandbox build --tag agentgym-sandbox:no-such-tag" in line
    assert not (workdir / "out").exists()


# --- options of another policy -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--model-path", "/models/m"],
                     "--model-path applies to --policy vllm or hf, not reference; "
                     "pass --policy vllm (or hf), or drop --model-path", id="model-path"),
        pytest.param(["--temperature", "0.3"],
                     "--temperature applies to --policy openai, vllm or hf, not reference; "
                     "pass --policy openai (or vllm, hf), or drop --temperature", id="temperature"),
        pytest.param(["--temperature", "1.0"], "--temperature applies to",
                     id="temperature-at-its-default-value"),
        pytest.param(["--max-tokens", "5"], "--max-tokens applies to --policy openai, vllm or hf",
                     id="max-tokens"),
        pytest.param(["--model", "m"], "--model applies to --policy openai or vllm, not reference",
                     id="model"),
        pytest.param(["--base-url", "http://127.0.0.1:9/v1"],
                     "--base-url applies to --policy openai, not reference", id="base-url"),
        pytest.param(["--api-key", "k"], "--api-key applies to --policy openai", id="api-key"),
        pytest.param(["--rollout-mode", "per_turn"],
                     "--rollout-mode applies to --policy vllm or hf", id="rollout-mode"),
        pytest.param(["--max-model-len", "512"], "--max-model-len applies to --policy vllm or hf",
                     id="max-model-len"),
        pytest.param(["--server", "http://127.0.0.1:9"], "--server applies to --policy vllm, not "
                     "reference", id="server"),
        pytest.param(["--policy", "openai", "--model", "m", "--model-path", "/models/m"],
                     "--model-path applies to --policy vllm or hf, not openai", id="openai-path"),
        pytest.param(["--policy", "hf", "--model-path", "/models/m", "--base-url", "http://x/v1"],
                     "--base-url applies to --policy openai, not hf", id="hf-base-url"),
        pytest.param(["--policy", "hf", "--model-path", "/models/m", "--model", "m"],
                     "--model applies to --policy openai or vllm, not hf", id="hf-model"),
        pytest.param(["--policy", "vllm", "--model-path", "/models/m", "--model", "m"],
                     "--model names the model a --server serves; the in-process engine runs "
                     "--model-path: drop it, or add --server URL", id="vllm-model-no-server"),
    ],
)  # fmt: skip
def test_an_option_of_another_policy_is_refused_before_any_work(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = run(tmp_path, "calculator", "-n", "2", *args)
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc).startswith(message)
    assert not (tmp_path / "out").exists()


def test_defaults_and_environment_variables_are_not_refused(tmp_path: Path) -> None:
    # OPENAI_API_KEY set for other tools, and the options at their defaults: nothing typed
    proc = run(tmp_path, "calculator", "-n", "2", env={"OPENAI_API_KEY": "sk-other-tool"})
    assert proc.returncode == 0, proc.stderr
    assert [t.status for t in read_jsonl(tmp_path / "out" / "trajectories.jsonl")] == ["ok"] * 2


def test_sampling_options_are_taken_under_the_openai_policy(tmp_path: Path) -> None:
    # nothing listens on the discard port: it runs (and fails as infra), it is not refused
    dead = ["--policy", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    sampling = ["--temperature", "0.2", "--max-tokens", "5"]
    proc = run(tmp_path, "calculator", "-n", "1", *dead, *sampling)
    assert proc.returncode == 75, proc.stderr
    run_config = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run_config["temperature"] == 0.2 and run_config["max_tokens"] == 5


def test_a_sampling_value_the_server_would_refuse_is_refused_before_the_run_is_indexed(
    tmp_path: Path,
) -> None:
    """It was refused once the run was indexed: a 'failed' row (exit 2) for a typo."""
    db = tmp_path / "runs.db"
    dead = ["--policy", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    proc = run(tmp_path, "calculator", "-n", "1", *dead, "--temperature", "-1",
               env={"AGENTGYM_RUNS_DB": str(db)})  # fmt: skip
    assert proc.returncode == 2
    assert "temperature=-1.0" in one_error_line(proc)
    assert not db.exists() and not (tmp_path / "out").exists()


# --- an env without a reference solution ---------------------------------------------------------


def test_an_env_without_a_reference_solution_is_refused_before_any_work(workdir: Path) -> None:
    """It played every episode as 'error' (a TypeError in ScriptedPolicy) and exited 0."""
    proc = run(workdir, "faulty:test/NoReference-v0")
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc) == (
        "this env has no reference solution (its reference_turns returns None); "
        "use --policy openai, vllm or hf"
    )
    assert not (workdir / "out").exists()


# --- episodes that errored -------------------------------------------------------------------


def test_a_run_whose_every_episode_errored_exits_1_naming_the_first_error(workdir: Path) -> None:
    proc = run(workdir, FAULTY, "--env-arg", "kinds=broken,broken")
    assert proc.returncode == 1, proc.stderr
    results = workdir / "out" / "trajectories.jsonl"
    assert last_line(proc) == (
        "error: all 2 episodes played ended in error (the first: RuntimeError: task 0 is "
        f"broken; see {results}); fix it, then rerun with another --out"
    )
    assert [t.status for t in read_jsonl(results)] == ["error"] * 2


def test_a_run_where_some_episodes_met_a_failed_service_exits_as_infra(workdir: Path) -> None:
    """It exited 0 (a server that died mid-eval: a finished job, never retried, its figures
    over the episodes before the failure); 75 makes a queue resume it, playing those again."""
    proc = run(workdir, FAULTY, "--env-arg", "kinds=ok,down,ok")
    assert proc.returncode == 75, proc.stderr
    results = workdir / "out" / "trajectories.jsonl"
    assert last_line(proc).endswith(
        "1 of 3 episodes played ended in infra_error (the model server or sandbox failed; the "
        "first: agentgym._errors.InfraError: the service of task 1 is down; see "
        f"{results}); fix it, then rerun with --resume to play them again"
    )
    by_task = sorted(read_jsonl(results), key=lambda t: t.task_index)  # written as they end
    assert [t.status for t in by_task] == ["ok", "infra_error", "ok"]
    assert json.loads((workdir / "out" / "summary.json").read_text())["episodes"] == 3


def test_a_run_where_some_episodes_errored_warns_and_exits_0(workdir: Path) -> None:
    proc = run(workdir, FAULTY, "--env-arg", "kinds=ok,broken,ok")
    assert proc.returncode == 0, proc.stderr
    results = workdir / "out" / "trajectories.jsonl"
    warning = f"warning: 1 of 3 episodes played ended in error; their tracebacks are in {results}"
    assert warning in proc.stderr.splitlines(), proc.stderr
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert summary["status"]["error"] == 1 and summary["status"]["ok"] == 2


def test_a_run_with_no_errored_episode_prints_no_warning(workdir: Path) -> None:
    proc = run(workdir, FAULTY, "--env-arg", "kinds=ok,ok")
    assert proc.returncode == 0, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if line.startswith(("warning", "error"))]


# --- Ctrl-C ----------------------------------------------------------------------------------


def test_ctrl_c_says_how_many_episodes_are_on_disk_and_exits_130(workdir: Path) -> None:
    """Task 0 plays at once; task 1 never ends, so the interrupt lands mid-run every time."""
    out = workdir / "out"
    results = out / "trajectories.jsonl"
    log = workdir / "eval.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [str(AGENTGYM), "eval", FAULTY, "--env-arg", "kinds=ok,stuck", "--out", str(out)],
            cwd=workdir, env=_env(), stdout=sink, stderr=subprocess.STDOUT,
            # a terminal's Ctrl-C: not SIGINT ignored, as a suite started in the background has it
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        try:
            deadline = time.monotonic() + DEADLINE_S
            while not (results.exists() and results.read_bytes().count(b"\n") >= 1):
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"no episode within {DEADLINE_S}s"
                time.sleep(0.01)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=DEADLINE_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    output = log.read_text()
    assert code == 130, output
    assert "Traceback" not in output, output
    assert (
        f"interrupted: 1 of 2 episodes are in {results}; run the same command with --resume "
        "to play the rest"
    ) in output.splitlines(), output
    assert [t.status for t in read_jsonl(results)] == ["ok"]
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize("policy", ["hf", "vllm"])
def test_a_model_whose_call_format_the_parser_does_not_read_is_refused_before_the_engine(
    workdir: Path, tiny_model_dir: Path, policy: str
) -> None:
    """The tiny model's template shows Hermes calls; under ``parser=llama3_json`` every call
    the model makes would read as text and the eval would report the parser's 0%."""
    proc = run(workdir, "calculator", "--policy", policy, "--model-path", str(tiny_model_dir),
               "-n", "1", "--env-arg", "parser=llama3_json")  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "does not read" in last_line(proc) and "--env-arg parser=hermes" in last_line(proc)
    assert not (workdir / "out").exists()  # refused before any episode


def test_a_model_whose_template_never_shows_the_tools_is_played_with_a_warning(
    workdir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """DeepSeek V3.1's template ignores ``tools``: the model is asked to call tools it was
    never shown. The trainer refuses that; an eval plays it as asked (a baseline of the model
    as it is), saying first that a 0% would measure the prompt, and how to list the tools."""
    model = tmp_path / "no-tools-template"
    shutil.copytree(tiny_model_dir, model)
    template = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '')"
                " + '<|im_end|>\\n' }}{%- endfor %}"
                "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    (model / "chat_template.jinja").write_text(template)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    proc = run(workdir, "calculator", "--policy", "hf", "--model-path", str(model), "-n", "1",
               "--max-tokens", "8")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warning = next(line for line in proc.stderr.splitlines() if line.startswith("warning: "))
    assert "does not render tools (the tool 'calculate' is missing" in warning, warning
    assert "--env-arg tool_prompt=system" in warning, warning
    assert (workdir / "out" / "summary.json").exists()  # played all the same
