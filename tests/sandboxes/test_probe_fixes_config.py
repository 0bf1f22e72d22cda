"""Config fixes from the probe: values Docker refuses are `ConfigError`s; verify's timeout limit."""

from __future__ import annotations

import warnings

import pytest

from agentgym._errors import ConfigError
from agentgym.sandboxes import (
    DockerSandbox,
    DockerSandboxConfig,
    LocalSandbox,
    SandboxPool,
    verify,
)
from agentgym.sandboxes._config import MAX_ID, MAX_PIDS, MIN_CPUS, MIN_NOFILE, check_image
from tests.sandboxes.conftest import require_docker


def _one_line(exc: pytest.ExceptionInfo[ConfigError], *parts: str) -> None:
    text = str(exc.value)
    assert "\n" not in text and all(part in text for part in parts), text


@pytest.mark.parametrize("knobs, parts", [
    ({"cpus": 0.005}, ("cpus must be >= 0.01", "0.005")),
    ({"nofile": 2}, ("nofile must be >= 32", "got 2")),
    ({"code_uid": 2**32 + 5}, ("code_uid must be <= 2147483647", "4294967301")),
    ({"keeper_uid": 2**31}, ("keeper_uid must be <= 2147483647",)),
    ({"pids_limit": 2**62}, ("pids_limit must be <= 4194304",)),
    ({"mem_limit_mb": 2**60}, ("mem_limit_mb must be <=",)),
])
def test_values_docker_refuses_are_one_line_config_errors(knobs, parts):
    with pytest.raises(ConfigError) as info:
        DockerSandboxConfig(**knobs)
    _one_line(info, *parts)


def test_the_edges_of_the_ranges_start_and_verify():
    """The limits are Docker's (measured), not tighter: a container at every edge works."""
    require_docker()
    edges = {"nofile": MIN_NOFILE, "pids_limit": MAX_PIDS, "code_uid": MAX_ID,
             "keeper_uid": MAX_ID - 1}  # fmt: skip
    code = "def f():\n    return 1"
    # pytest, the mode that needs the most open files (MIN_NOFILE), at every edge but the
    # CPU quota: at 1 % of a core its imports alone take 20 s. The smallest quota (Docker's)
    # gets the same edges and the assert mode, which runs the code in the container all the same.
    # At 1 % of a core on a loaded CI machine one test took over verify's default 5 s, so
    # the per-test limit is wide: this test is about which values start, not about speed.
    runs = [({}, "pytest", "from solution import f\n\ndef test_f():\n    assert f() == 1\n"),
            ({"cpus": MIN_CPUS}, "assert", ["assert f() == 1"])]  # fmt: skip
    for quota, mode, tests in runs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with DockerSandbox(config=DockerSandboxConfig(**quota, **edges)) as sb:
                result = verify(code, tests, mode=mode, sandbox=sb, per_test_timeout=60,
                                total_timeout=120)
        assert result.status == "passed", (quota, mode, result)


@pytest.mark.parametrize("image", ["UPPER/Case:x", "Upper:py3", "a:b:c", "img:-tag",
                                   "ghcr.io/org/x@sha256:short", "x" * 300 + ":"])
def test_an_invalid_image_reference_is_a_one_line_config_error(image):
    for make in (DockerSandbox, lambda image: SandboxPool(size=1, image=image)):
        with pytest.raises(ConfigError) as info:
            make(image)
        _one_line(info, "image must be a Docker image reference", "lowercase")


@pytest.mark.parametrize("image", [
    "agentgym-sandbox:py3", "python:3.11-slim", "localhost:5000/team/img:1.0-rc",
    "registry.example.com:443/a/b__c", "ghcr.io/org/x@sha256:" + "a" * 64, "[::1]:5000/img",
    "sha256:" + "b" * 64,
])
def test_valid_image_references_pass(image):
    assert check_image(image) == image


def test_verify_names_total_timeouts_own_limit():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = LocalSandbox()
    with sb:
        with pytest.raises(ConfigError) as info:
            verify("x = 1", ["assert x == 1"], sandbox=sb, total_timeout=604800)
        _one_line(info, "total_timeout must be", "<= 604795", "got 604800")
        assert verify("x = 1", ["assert x == 1"], sandbox=sb,
                      total_timeout=604795).status == "passed"
