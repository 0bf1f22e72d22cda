"""A user trains a code agent whose reward runs in a Docker sandbox, from the docs, on the CLI.

The config is what docs/envs/pythoncode.md and docs/trainer.md lead to: ``env: pythoncode``
with the user's own tasks file, the tiny local model, two GRPO steps rolled out with
transformers (``rollout_engine: hf``: no vLLM engine to start for so small a run). The tiny
model writes garbage, so rewards are 0; what is checked is the plumbing around the sandbox.
Mistakes found by playing the journey, each now a test here:

- a missing sandbox image, or a Docker daemon that does not answer, passed the preflight: the
  model loaded, every episode ended ``infra_error`` and a two-step run exited 0 having scored
  nothing. Now one line, exit 2, before the model loads and before the run folder exists;
- with ``DOCKER_HOST`` set to a dead daemon, the error said "set DOCKER_HOST": it now names
  the value that failed;
- a run's metrics never said that its rewards ran in sandboxes (docs/sandboxes.md: "log as
  ``sandbox/*``"): each step now logs the shared pool's ``sandbox/*`` counters.

Containers are told apart from other processes' by their ``agentgym.owner`` label (the pid of
the training process, `agentgym.sandboxes._reap`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.sandboxes.conftest import require_docker

pytestmark = [pytest.mark.docker, pytest.mark.slow]

CLI = str(Path(sys.executable).with_name("agentgym"))
TASKS = [
    {"prompt": "Write add(a, b) returning their sum.",
     "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
     "solution": "def add(a, b):\n    return a + b"},
    {"prompt": "Write is_palindrome(s).",
     "tests": ["assert is_palindrome('abba')", "assert not is_palindrome('abc')"]},
    {"prompt": "Write squares(n): the squares of 0..n-1 as a list.",
     "tests": ["assert squares(3) == [0, 1, 4]"]},
    {"prompt": "Read two integers on one line; print their sum.",
     "tests": [{"input": "1 2\n", "output": "3\n"}]},
    {"prompt": "Write double(x).", "tests": ["assert double(2) == 4"]},
    {"prompt": "Write neg(x).", "tests": ["assert neg(2) == -2"]},
]  # fmt: skip
STEPS, EPISODES_PER_STEP = 2, 4  # tasks_per_step x num_generations
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's working folder, with the tasks file the config names."""
    require_docker()
    path = tmp_path_factory.mktemp("code_agent")
    (path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return path


def write_config(folder: Path, name: str, **changes: Any) -> Path:
    """A train config as a user writes it from the docs; ``changes`` override its keys."""
    config = {
        "model": "tiny", "env": "pythoncode",
        "env_kwargs": {"tasks": str(folder / "tasks.jsonl"), "pool_size": 2,
                       "per_test_timeout": 5},
        "train_tasks": "2:6", "eval_tasks": "0:2",
        "max_turns": 2, "max_completion_length": 24, "max_model_len": 1024,
        "num_generations": 2, "tasks_per_step": 2, "max_steps": STEPS,
        "learning_rate": 1.0e-2, "lora_r": 8, "lora_alpha": 16,
        "rollout_engine": "hf", "device": "cpu", "seed": 0, "report_to": ["none"],
        "output_dir": str(folder / name),
        **changes,
    }  # fmt: skip
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def train(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``agentgym train CONFIG ARGS`` as a child process (its pid owns its containers).

    Its output goes to files next to the config (a pipe nobody reads while it runs could fill
    and stall it); `finish` reads them.
    """
    with open(config.with_suffix(".out"), "w") as out, open(config.with_suffix(".err"), "w") as err:
        return subprocess.Popen([CLI, "train", str(config), *args], stdout=out, stderr=err,
                                text=True, env={**os.environ, **(env or {})})


def finish(child: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Wait for a `train` child: its exit code, stdout and stderr."""
    code = child.wait(timeout=RUN_TIMEOUT_S)
    config = Path(child.args[2])  # type: ignore[index]
    return code, config.with_suffix(".out").read_text(), config.with_suffix(".err").read_text()


def containers_of(pid: int) -> list[str]:
    """Ids of the agentgym containers, running or not, that process ``pid`` created."""
    listed = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", "label=agentgym.managed=1",
         "--filter", f"label=agentgym.owner={pid}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return listed.stdout.split()


def step_lines(run: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's training-step lines (not the eval lines)."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if "rollout/episodes" in m]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def trained(folder: Path) -> tuple[Path, int, str]:
    """One clean two-step run: its folder, the trainer's pid and its console output."""
    child = train(write_config(folder, "run"))
    code, out, err = finish(child)
    assert code == 0, err[-2000:]
    return folder / "run", child.pid, out


def test_a_sandboxed_run_trains_end_to_end_and_scores_every_episode_in_a_sandbox(
    trained: tuple[Path, int, str],
) -> None:
    run, _, out = trained
    for name in ("config.yaml", "metrics.jsonl", "status.json", "summary.json",
                 "eval_trajectories.jsonl", "reward_curve.png", "train.log"):  # fmt: skip
        assert (run / name).is_file(), name
    assert (run / "checkpoints" / f"step-{STEPS:06d}").is_dir()
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    assert f"run folder: {run}" in out
    steps = step_lines(run)
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    for m in steps:
        assert m["rollout/episodes"] == EPISODES_PER_STEP
        assert m["rollout/infra_error_episodes"] == 0
        assert 0.0 <= m["reward/passes_tests/mean"] <= 1.0  # the sandboxed reward was computed
    evals = records(run / "eval_trajectories.jsonl")
    assert len(evals) == 2 * 2  # the 2 held-out tasks, before and after
    assert {t["status"] for t in evals} <= {"ok", "error", "truncated"}
    assert all(t["scores"]["passes_tests"] is not None for t in evals)


def test_each_step_logs_the_sandbox_pools_counters(trained: tuple[Path, int, str]) -> None:
    """``sandbox/leases`` grows by the step's episodes: every one leased a sandbox."""
    steps = step_lines(trained[0])
    assert all(m["sandbox/created"] >= 2 and m["sandbox/create_failures"] == 0 for m in steps)
    grown = steps[1]["sandbox/leases"] - steps[0]["sandbox/leases"]
    assert grown == steps[1]["rollout/episodes"]


def test_no_sandbox_container_outlives_a_finished_run(trained: tuple[Path, int, str]) -> None:
    assert containers_of(trained[1]) == []


def test_a_run_killed_mid_step_leaves_no_containers_and_resumes(folder: Path) -> None:
    """kill -9 runs no exit hook, yet its containers go: each one's keeper reads a lifeline
    only the run held open (they stayed until the resumed run's pool reaped them).

    Two steps are the fewest that show it: step 1 checkpointed, step 2 killed and replayed
    (a step took 4 s on an idle machine, 24 s on a loaded one: each one more is that much)."""
    config = write_config(folder, "killed", max_steps=2, save_steps=1)
    checkpoint = folder / "killed" / "checkpoints" / "step-000001"  # written after step 1's line
    child = train(config)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not checkpoint.is_dir():  # renamed into place whole (`atomic_dir`)
        assert child.poll() is None and time.monotonic() < deadline, finish(child)
        time.sleep(0.2)  # polling a condition, with a deadline; not a wait for time to pass
    assert containers_of(child.pid), "the run's pool holds containers while it runs"
    child.send_signal(signal.SIGKILL)  # in step 2: step 1 is checkpointed, 2's line not written
    child.wait(timeout=30)
    deadline = time.monotonic() + 30
    while leaked := containers_of(child.pid):
        assert time.monotonic() < deadline, f"the killed run's containers stayed: {leaked}"
        time.sleep(0.2)  # polling the daemon's list, with a deadline
    resumed = train(config, "--resume")
    code, out, err = finish(resumed)
    assert code == 0, err[-2000:]
    assert [m["step"] for m in step_lines(folder / "killed")] == [1, 2]
    assert "from checkpoint step 1;" in (folder / "killed" / "train.log").read_text()
    assert containers_of(child.pid) == [] and containers_of(resumed.pid) == []


def test_a_sandbox_failing_mid_run_drops_its_episodes_and_the_run_goes_on(folder: Path) -> None:
    """One sandbox and a 10 ms lease timeout: episodes that find none are ``infra_error``."""
    config = write_config(
        folder, "starved",
        env_kwargs={"tasks": str(folder / "tasks.jsonl"), "pool_size": 1, "lease_timeout": 0.01},
    )  # fmt: skip
    child = train(config)
    code, _, err = finish(child)
    assert code == 0, err[-2000:]
    steps = step_lines(folder / "starved")
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    for m in steps:
        failed = m["rollout/infra_error_episodes"]
        assert 1 <= failed < EPISODES_PER_STEP
        # dropped from the groups, never scored 0: only the episodes that ran train
        assert m["train/samples"] == EPISODES_PER_STEP - failed
    evals = records(folder / "starved" / "eval_trajectories.jsonl")
    starved = [t for t in evals if t["status"] == "infra_error"]
    assert starved and all("no sandbox free within" in t["error"] for t in starved)
    assert containers_of(child.pid) == []


@pytest.mark.parametrize(
    ("problem", "env_kwargs", "environ", "says"),
    [
        ("missing image", {"image": "agentgym-sandbox:no-such-tag"}, {},
         "image 'agentgym-sandbox:no-such-tag' not found on host 'local': pull it "
         "(`docker pull agentgym-sandbox:no-such-tag`) or build it there"),
        ("dead daemon", {}, {"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
         "cannot reach the Docker daemon 'local'"),
    ],
)  # fmt: skip
def test_the_preflight_refuses_a_run_without_its_sandbox_before_the_model_loads(
    folder: Path, problem: str, env_kwargs: dict[str, str], environ: dict[str, str], says: str
) -> None:
    name = problem.replace(" ", "_")
    kwargs = {"tasks": str(folder / "tasks.jsonl"), **env_kwargs}
    code, out, err = finish(train(write_config(folder, name, env_kwargs=kwargs), env=environ))
    assert code == 2, out + err
    assert len(err.strip().splitlines()) == 1, err  # one line, no traceback
    assert err.startswith("error: env 'pythoncode' runs code in Docker sandboxes: ")
    assert says in err
    if environ:
        assert "fix DOCKER_HOST=unix:///nonexistent/docker.sock" in err  # the value that failed
    assert "Loading weights" not in out + err  # refused before the model loaded
    assert not (folder / name).exists()  # no run folder that a retry would need --resume for


def test_train_from_python_removes_its_sandboxes_when_it_returns(folder: Path) -> None:
    """In a notebook the kernel lives on after `train()`: the run's containers stayed up until
    it exited (the interpreter's exit hook was what removed them)."""
    config = yaml.safe_load(write_config(folder, "in_python", max_steps=1).read_text())
    script = (
        "import os, sys, yaml\n"
        "from agentgym.trainers import GRPOConfig, GRPOTrainer\n"
        "from tests.trainers.test_sandbox_training_journey import containers_of\n"
        f"GRPOTrainer(GRPOConfig(**yaml.safe_load({yaml.safe_dump(config)!r}))).train()\n"
        "print('LEFT', len(containers_of(os.getpid())))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, cwd=Path(__file__).parents[2])  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    metrics = [json.loads(line) for line in (folder / "in_python" / "metrics.jsonl").open()]
    assert max(m.get("sandbox/created", 0) for m in metrics) >= 1  # its rewards ran in sandboxes
    assert "LEFT 0" in done.stdout, done.stdout[-2000:]
