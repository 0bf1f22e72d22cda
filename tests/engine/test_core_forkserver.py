"""A process's second and later engine cores fork from a forkserver with vLLM loaded.

The forkserver is one per process and lives as long as it: every test here uses the one this
process's engines started (the module's fixture starts two where none ran before), so that
the engines of later tests find it as the real flow leaves it. `tests/engine/test_orphan_guard.py`
checks that an engine core started from it ends with its owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentgym.engine import SamplingConfig, VLLMPolicy, _core_forkserver
from tests.conftest import require

pytestmark = [pytest.mark.vllm, pytest.mark.engine]


def test_the_variables_compared_are_those_read_when_torch_and_vllm_load() -> None:
    environ = {"VLLM_LOGGING_LEVEL": "INFO", "OMP_NUM_THREADS": "2", "LD_PRELOAD": "x.so",
               "PYTEST_CURRENT_TEST": "t", "AGENTGYM_ENGINE_OWNER": "1", "HOME": "/root"}
    assert _core_forkserver.load_time_environment(environ) == {
        "VLLM_LOGGING_LEVEL": "INFO", "OMP_NUM_THREADS": "2", "LD_PRELOAD": "x.so"}  # fmt: skip


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (descriptors 1 and 2) go to ``path`` meanwhile."""
    saved = os.dup(1), os.dup(2)
    with path.open("w") as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        try:
            yield
        finally:
            for target, fd in zip((1, 2), saved):
                os.dup2(fd, target)
                os.close(fd)


def engine(model: Path) -> VLLMPolicy:
    return VLLMPolicy(model, dtype="float32", max_model_len=512,
                      sampling=SamplingConfig(max_tokens=4))  # fmt: skip


@pytest.fixture(scope="module")
def second_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    tuple[VLLMPolicy, Path]
]:
    """A running engine started after another (this process's first engine is spawned), while
    this process wrote to a file of its own: the engine and that file."""
    require("vllm")
    if _core_forkserver._core_starts == 0:
        with engine(tiny_model_dir):  # started and closed
            pass
    output = tmp_path_factory.mktemp("second-engine") / "output.txt"
    policy = engine(tiny_model_dir)
    with output_to(output):
        policy.start()
    with policy:
        yield policy, output


def test_a_second_engines_core_forks_from_the_forkserver_and_writes_where_its_caller_did(
    second_engine: tuple[VLLMPolicy, Path],
) -> None:
    psutil = require("psutil")
    policy, output = second_engine
    below = psutil.Process().children(recursive=True)
    [core] = [p for p in below if "VLLM::EngineCore" in " ".join(p.cmdline())]  # vLLM's title
    assert _core_forkserver._started is not None
    assert core.ppid() == _core_forkserver._started[0], "the engine core was spawned"
    for fd in (1, 2):  # where this process wrote while it started (the forkserver: elsewhere)
        assert os.readlink(f"/proc/{core.pid}/fd/{fd}") == str(output)
    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "hi"}], [])
    completion = asyncio.run(policy.generate_ids(prompt))
    assert completion.completion_ids and len(completion.completion_ids) <= 4  # it samples


def report_what_the_child_got(path: str) -> None:
    """Run in the forkserver's child: what it was given, written where the test reads it."""
    Path(path).write_text("\n".join([
        os.environ.get("AGENTGYM_TEST_CALLER_MARK", "unset"), os.readlink("/proc/self/fd/1"),
        os.readlink("/proc/self/fd/2"), str(os.getppid())]))  # fmt: skip


def test_a_child_runs_with_the_callers_environment_and_streams_of_now(
    second_engine: tuple[VLLMPolicy, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forkserver's child inherits the forkserver's environment, and the stdout and stderr
    of its process when the forkserver started: a spawned engine core had the caller's, as
    they were at its start."""
    monkeypatch.setenv("AGENTGYM_TEST_CALLER_MARK", str(tmp_path))  # set after it started
    report, output = tmp_path / "child.txt", tmp_path / "output.txt"
    child = _core_forkserver._CallerForkServerContext().Process(
        target=report_what_the_child_got, args=(str(report),))  # fmt: skip
    with output_to(output):
        child.start()
    child.join(60)
    assert child.exitcode == 0
    mark, stdout, stderr, parent = report.read_text().split("\n")
    assert mark == str(tmp_path)
    assert stdout == stderr == str(output)
    assert _core_forkserver._started is not None
    assert int(parent) == _core_forkserver._started[0]  # the forkserver forked it


def test_a_changed_load_time_variable_or_someone_elses_forkserver_is_not_used(
    second_engine: tuple[VLLMPolicy, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _core_forkserver._forkserver_usable(os.environ)
    debug = {**os.environ, "VLLM_LOGGING_LEVEL": "DEBUG"}  # vLLM's logger reads it at import
    assert not _core_forkserver._forkserver_usable(debug)  # the forkserver loaded without it
    assert _core_forkserver._forkserver_usable({**os.environ, "PYTEST_CURRENT_TEST": "other"})
    monkeypatch.setattr(_core_forkserver, "_started", None)  # running, but not started by us
    assert not _core_forkserver._forkserver_usable(os.environ)
