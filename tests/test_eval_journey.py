"""`agentgym eval` as a new user meets it: the mistakes one makes on the command line.

Each was found playing README's use 3 from a scratch folder: a negative ``--seed`` played the
whole run into ``error``; ``-n`` beyond the env's tasks played fewer without a word; a
``--base-url`` without ``/v1``, an unserved ``--model`` or a refused key filed every episode
``infra_error`` and exited 75 (a retry that cannot succeed); only the first N tasks could be
played (``--tasks START:END`` now). The CLI runs in a subprocess where a refusal's only stderr
line (with every warning its process prints) is tested, and in this process (`agentgym_here`)
where what the run wrote and said on its console is; the OpenAI-compatible server is a small
stdlib one in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from agentgym import read_jsonl, summarize
from agentgym._trajectory import STATUSES, Trajectory, Turn
from tests.conftest import agentgym_here, send_json, serving

AGENTGYM = Path(sys.executable).parent / "agentgym"
SERVED = "served-model"
KEY = "right-key"


def eval_in(workdir: Path, *args: str) -> list[str]:
    """``agentgym eval calculator ARGS`` writing into ``workdir/out``, as a user types it."""
    return ["eval", "calculator", *args, "--out", str(workdir / "out")]


def run(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb",
        "AGENTGYM_RUNS_DB": "off",
    }  # fmt: skip
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(
        [str(AGENTGYM), *eval_in(workdir, *args)],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0].removeprefix("error: ")


class _Handler(BaseHTTPRequestHandler):
    """vLLM's shape: the API under ``/v1``, ``/v1/models`` listing one name, a bearer key."""

    def _answer(self, status: int, body: dict[str, object]) -> None:
        send_json(self, status, body)

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {KEY}":
            return True
        self._answer(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != "/v1/models":
            self._answer(404, {"detail": "Not Found"})
        elif self._authorised():
            self._answer(200, {"object": "list", "data": [{"id": SERVED, "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", 0))
        self._reply(json.loads(self.rfile.read(length)))

    def _reply(self, request: dict[str, object]) -> None:
        if self.path != "/v1/chat/completions":
            self._answer(404, {"detail": "Not Found"})
        elif request.get("model") != SERVED:
            self._answer(404, {"error": {"message": f"The model `{request.get('model')}`"}})
        elif self._authorised():
            message = {"role": "assistant", "content": "The answer is 90."}
            self._answer(200, {"choices": [{"message": message, "finish_reason": "stop"}]})

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the CLI's output, not the server's."""





@pytest.fixture
def server() -> Iterator[str]:
    """The root URL (no ``/v1``) of a server that answers until the test ends."""
    with serving(_Handler) as url:
        yield url


def openai(server_url: str, *args: str) -> list[str]:
    return ["--policy", "openai", "--base-url", server_url, "-n", "2", *args]


def test_a_negative_seed_is_refused_before_any_work(tmp_path: Path) -> None:
    """``--seed -3`` played every episode into gymnasium's seed error and wrote the folder."""
    proc = run(tmp_path, "--seed", "-3", "-n", "2")
    assert proc.returncode == 2
    assert "--seed" in one_error_line(proc) and "greater than or equal to 0" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_more_tasks_than_the_env_has_are_played_with_a_warning(tmp_path: Path) -> None:
    proc = agentgym_here(*eval_in(tmp_path, "-n", "1000"))
    assert proc.returncode == 0, proc.stderr
    assert "warning: -n 1000, but the env has 100 tasks; playing all 100" in proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["episodes"] == 100
    assert summary["findings"] == [] and "health [" not in proc.stderr  # the reference is well


def test_as_many_tasks_as_the_env_has_warns_nothing(tmp_path: Path) -> None:
    proc = run(tmp_path, "-n", "100")
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr


def test_a_task_range_plays_exactly_those_tasks_and_resumes_only_them(tmp_path: Path) -> None:
    """Only the first N tasks could be played: not a run's held-out split, nor train tasks to
    record episodes on for `agentgym sft` (the first N are the quickstart's held-out ones)."""
    assert agentgym_here(*eval_in(tmp_path, "--tasks", "40:45")).returncode == 0
    results = tmp_path / "out" / "trajectories.jsonl"
    assert sorted(t.task_index for t in read_jsonl(results)) == [40, 41, 42, 43, 44]  # as done
    again = agentgym_here(*eval_in(tmp_path, "--tasks", "40:45", "--resume"))
    assert again.returncode == 0 and len(list(read_jsonl(results))) == 5, again.stderr
    other = run(tmp_path, "--tasks", "40:46", "--resume")  # another range: another run
    assert other.returncode == 2 and "tasks" in one_error_line(other)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--tasks", "95:105"],
         "reaches task 104 but 'agentgym/Calculator-v0' has 100 tasks (0:100)"),
        (["--tasks", "40:45", "-n", "5"], "give --tasks START:END or -n N, not both"),
        (["--tasks", "7"], "is not a non-empty 'start:stop' range"),
    ],
    ids=["past_the_env", "with_n", "not_a_range"],
)
def test_a_task_range_that_cannot_be_played_is_one_line(
    tmp_path: Path, args: list[str], error: str
) -> None:
    proc = run(tmp_path, *args)
    assert proc.returncode == 2 and error in one_error_line(proc)
    assert not (tmp_path / "out").exists()


def test_a_base_url_without_v1_is_refused_naming_the_v1_url(tmp_path: Path, server: str) -> None:
    proc = run(tmp_path, *openai(server, "--model", SERVED, "--api-key", KEY))
    assert proc.returncode == 2
    assert one_error_line(proc).endswith(f"pass --base-url {server}/v1")
    assert not (tmp_path / "out").exists()


def test_a_model_the_server_does_not_serve_is_refused_naming_what_it_serves(
    tmp_path: Path, server: str
) -> None:
    proc = run(tmp_path, *openai(f"{server}/v1", "--model", "typo", "--api-key", KEY))
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line.startswith("--model typo is not served") and line.endswith(f"--model {SERVED}")
    assert not (tmp_path / "out").exists()


def test_a_refused_api_key_is_one_line_naming_the_option(tmp_path: Path, server: str) -> None:
    proc = run(tmp_path, *openai(f"{server}/v1", "--model", SERVED, "--api-key", "wrong"))
    assert proc.returncode == 2
    assert "refused the API key (401); pass --api-key" in one_error_line(proc)
    assert not (tmp_path / "out").exists()


def test_the_right_url_name_and_key_play_the_run(tmp_path: Path, server: str) -> None:
    proc = agentgym_here(*eval_in(tmp_path, *openai(f"{server}/v1", "--model", SERVED,
                                                     "--api-key", KEY)))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    played = list(read_jsonl(tmp_path / "out" / "trajectories.jsonl"))
    assert [t.status for t in played] == ["ok", "ok"]
    first = next(t for t in played if t.task_index == 0)  # lines come in finishing order
    assert first.final_reward == 1.0  # task 0 asks 66 + 24; the server says 90
    # the server's model answers without the calculator: the eval says so, and what to do
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [f["rule"] for f in summary["findings"]] == ["no-tool-calls"]
    assert summary["health"] == {"findings": 1}  # the figure `runs ls` and `compare` show
    assert "health [no-tool-calls] the model never called a tool: 0 tool calls and 1 turn per " \
        "episode in this eval" in proc.stderr and "agentgym check ENV --model" in proc.stderr
    doctor = subprocess.run([str(AGENTGYM), "runs", "doctor", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "AGENTGYM_RUNS_DB": "off", "COLUMNS": "250"})
    assert doctor.returncode == 1 and "[no-tool-calls]" in doctor.stdout, doctor.stderr


def test_an_unreachable_server_is_still_the_runs_infra_error(tmp_path: Path) -> None:
    """Down is the machinery's failure: exit 75 (retry), not a refused command."""
    proc = run(tmp_path, *openai("http://127.0.0.1:9/v1", "--model", SERVED))
    assert proc.returncode == 75, proc.stderr
    assert "infra_error" in proc.stderr


def _episode(status: str, turns: int, reward: float | None = None) -> Trajectory:
    trajectory = Trajectory(env_id="x", task_position=0, status=status, final_reward=reward)  # type: ignore[arg-type]
    trajectory.turns = [Turn(text="t", completion_ids=[1, 2, 3, 4]) for _ in range(turns)]
    return trajectory


def test_failed_episodes_do_not_shorten_the_per_episode_means() -> None:
    """Half the episodes cut by the server at turn 0 read as episodes half as long."""
    played = [_episode("ok", 2, 1.0), _episode("ok", 2, 0.0)]
    played += [_episode("infra_error", 0), _episode("late", 0), _episode("infra_error", 1)]
    summary = summarize(played)
    assert summary["turns/mean"] == 2.0
    assert summary["tokens/per_episode"] == 8.0  # the scored episodes' 2 turns x 4 tokens
    assert summary["tokens/completions_total"] == 20  # every sampled token is a cost
    assert summarize([_episode("infra_error", 0)])["turns/mean"] is None


def test_the_status_counts_list_every_status_in_one_order() -> None:
    first_failed = summarize([_episode("infra_error", 0), _episode("ok", 1, 1.0)])["status"]
    first_ok = summarize([_episode("ok", 1, 1.0), _episode("infra_error", 0)])["status"]
    assert list(first_failed) == list(first_ok) == list(STATUSES)
    assert first_failed == {"ok": 1, "truncated": 0, "error": 0, "infra_error": 1, "late": 0}


def test_an_out_holding_a_train_run_is_refused_before_its_summary_is_overwritten(
    tmp_path: Path,
) -> None:
    """``--out`` at the run folder is a natural thing to type: the eval replaced the run's
    summary.json (figures, findings, eval history) with its own, and exited 0."""
    run_dir = tmp_path / "out"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("model: tiny\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    (run_dir / "summary.json").write_text('{"figures": {"grpo/success": 0.9}}')
    proc = run(tmp_path, "-n", "2")
    assert proc.returncode == 2
    said = one_error_line(proc)
    assert said.startswith(
        f"--out {run_dir} holds an agentgym train run (config.yaml, "
        "metrics.jsonl), whose files this eval run would overwrite"
    ), said
    assert said.endswith(f"such as {run_dir / 'eval'}"), said
    assert (run_dir / "summary.json").read_text() == '{"figures": {"grpo/success": 0.9}}'
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
    ]


@pytest.mark.parametrize("count", ["0", "-3"])
def test_an_env_made_with_no_tasks_is_refused_in_one_line(tmp_path: Path, count: str) -> None:
    """It warned "playing all 0", drew an empty progress bar, then failed naming the Python
    API's ``tasks=[...]``, and was indexed as a failed run. (The env refuses the count now,
    before eval's own "the env has no tasks to play" could.)"""
    proc = run(tmp_path, "-n", "2", "--env-arg", f"num_tasks={count}")
    assert proc.returncode == 2
    assert one_error_line(proc) == f"num_tasks must be an int >= 1, got {count}"
    assert not (tmp_path / "out").exists()



class _HoldingHandler(_Handler):
    """Never answers task 0 (66 + 24) until ``released``: a server that went quiet on one
    request, as a judge or a tool without a timeout of its own can."""

    released = threading.Event()

    def _reply(self, request: dict[str, object]) -> None:
        if "66" in json.dumps(request) and "24" in json.dumps(request) \
                and not self.released.is_set():  # fmt: skip
            self.released.wait(60)  # the quiet request under test (set by the fixture's end)
            return  # its client gave up on it long before: nobody to answer
        super()._reply(request)


@pytest.fixture
def holding_server() -> Iterator[str]:
    """The ``/v1`` URL of a server that does not answer task 0 until the test ends."""
    _HoldingHandler.released.clear()
    with serving(_HoldingHandler) as url:
        try:
            yield f"{url}/v1"
        finally:  # before the server shuts down: no request is left held
            _HoldingHandler.released.set()


def test_an_episode_past_episode_timeout_is_late_and_resume_plays_it_again(
    tmp_path: Path, holding_server: str
) -> None:
    """One episode whose request never came back held the whole eval until the server let go:
    ``--episode-timeout`` cuts it (late, not scored), the others are scored, and ``--resume``
    plays it again."""
    args = [*openai(holding_server, "--model", SERVED, "--api-key", KEY), "-n", "3"]
    args += ["--episode-timeout", "2"]
    proc = agentgym_here(*eval_in(tmp_path, *args))
    assert proc.returncode == 0, proc.stderr
    assert "1 of 3 episodes played were cut at --episode-timeout 2 s" in proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"]["late"] == 1 and summary["status"]["ok"] == 2
    _HoldingHandler.released.set()
    again = agentgym_here(*eval_in(tmp_path, *args, "--resume"))
    assert again.returncode == 0, again.stderr
    played = list(read_jsonl(tmp_path / "out" / "trajectories.jsonl"))
    assert sorted((t.task_index, t.status) for t in played) == [(0, "ok"), (1, "ok"), (2, "ok")]


def test_an_eval_whose_every_episode_passed_episode_timeout_exits_1(
    tmp_path: Path, holding_server: str
) -> None:
    args = [*openai(holding_server, "--model", SERVED, "--api-key", KEY), "-n", "1"]
    proc = agentgym_here(*eval_in(tmp_path, *args, "--episode-timeout", "1"))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]  # after the progress bar
    assert last.startswith("error: 1 of 1 episodes played were cut at --episode-timeout 1 s")


def test_the_server_an_eval_sampled_on_is_recorded_without_its_credentials(
    tmp_path: Path, server: str
) -> None:
    """Two evals of one served name on different servers had identical configs (``runs
    compare`` called them the same), and a resume could mix both servers' episodes."""
    from agentgym._eval_cli import _without_credentials

    proc = agentgym_here(*eval_in(tmp_path, *openai(f"{server}/v1", "--model", SERVED,
                                                     "--api-key", KEY)))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "out" / "run.json").read_text())
    assert saved["base_url"] == f"{server}/v1"
    port = server.rpartition(":")[2]
    elsewhere = run(tmp_path, *openai(f"http://localhost:{port}/v1", "--model", SERVED,
                                      "--api-key", KEY, "--resume"))  # fmt: skip
    assert elsewhere.returncode == 2 and "base_url" in one_error_line(elsewhere)
    assert _without_credentials("https://me:pw@host:8000/v1?key=pw") == "https://host:8000/v1"


def test_a_run_saved_before_its_server_was_recorded_still_resumes(
    tmp_path: Path, server: str
) -> None:
    """``run.json`` gained ``base_url``: a folder written without it refused every resume."""
    args = openai(f"{server}/v1", "--model", SERVED, "--api-key", KEY)
    assert agentgym_here(*eval_in(tmp_path, *args)).returncode == 0
    saved = tmp_path / "out" / "run.json"
    older = json.loads(saved.read_text())
    del older["base_url"]
    saved.write_text(json.dumps(older))
    (tmp_path / "out" / "summary.json").unlink()  # killed before its summary: plays none again
    again = agentgym_here(*eval_in(tmp_path, *args, "--resume"))
    assert again.returncode == 0, again.stderr
