"""SandboxToolEnv: a lease per episode, ended with the episode; shared pools that heal."""

from __future__ import annotations

import json
import warnings

import pytest

import agentgym
from agentgym import ConfigError, SandboxError, tool
from agentgym.sandboxes import (
    DEFAULT_IMAGE,
    Sandbox,
    SandboxLease,
    SandboxToolEnv,
    close_shared_pools,
)

RETRY_IMAGE = "agentgym-sandbox:retry-test"
LEASES: list[SandboxLease] = []


@tool
async def python(code: str, sandbox: Sandbox) -> str:
    """Run Python code.

    Args:
        code: the source.
        sandbox: the episode's sandbox (injected).
    """
    LEASES.append(sandbox)
    return (await sandbox.arun(code)).stdout


def say(text: str) -> list[str]:
    """A script that prints ``text`` with the tool, then answers."""
    call = {"name": "python", "arguments": {"code": f"print({text!r})"}}
    return [f"<tool_call>{json.dumps(call)}</tool_call>", "done"]


def play(**env_kwargs) -> agentgym.Trajectory:
    def make() -> SandboxToolEnv:
        return SandboxToolEnv([python], tasks=[{"prompt": "say hi"}], **env_kwargs)

    [trajectory] = agentgym.rollout(make, agentgym.ScriptedPolicy(say("hi")), tasks=[0])
    return trajectory


@pytest.mark.parametrize("kwargs, fragment", [
    ({"backend": "podman"}, "backend"),
    ({"pool_size": 0}, "pool_size"),
    ({"lease_timeout": 0}, "lease_timeout"),
])
def test_bad_knobs_are_config_errors(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        SandboxToolEnv([python], **kwargs)


def test_local_backend_leases_per_episode_and_ends_the_lease():
    LEASES.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LocalSandbox says it is not a security boundary
        trajectory = play(backend="local")
    assert trajectory.status == "ok", trajectory.error
    assert trajectory.messages[3]["content"] == "hi\n"
    [lease] = LEASES
    assert lease.ended, "the episode's lease outlived the episode"
    with pytest.raises(SandboxError, match="lease has ended"):
        lease.run("print(1)")


def test_a_turn_runs_at_most_two_sandbox_calls_by_default():
    # the episode's calls share its sandbox, one after another: a turn of many slow calls
    # would only run out the step's deadline (late: dropped, not scored)
    LEASES.clear()
    calls = "".join(say(str(i))[0] for i in range(5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LocalSandbox says it is not a security boundary
        make = lambda: SandboxToolEnv([python], tasks=[{"prompt": "x"}], backend="local")  # noqa: E731
        [t] = agentgym.rollout(make, agentgym.ScriptedPolicy([calls, "done"]), tasks=[0])
    assert t.status == "ok", t.error
    assert [m["content"] for m in t.messages[3:5]] == ["0\n", "1\n"] and len(LEASES) == 2
    assert all("at most 2 run per turn" in m["content"] for m in t.messages[5:8])


@pytest.mark.docker
def test_a_failed_pool_start_is_infra_error_and_a_later_episode_retries(docker_client):
    # a real transient failure: the image is missing for the first episode only
    close_shared_pools()
    try:
        first = play(image=RETRY_IMAGE, pool_size=1)
        assert first.status == "infra_error" and first.final_reward is None
        assert "failed to start" in first.error and "not found" in first.error
        docker_client.images.get(DEFAULT_IMAGE).tag(RETRY_IMAGE)
        second = play(image=RETRY_IMAGE, pool_size=1)  # waits out the first backoff (1 s)
        assert second.status == "ok", second.error
        assert second.messages[3]["content"] == "hi\n"
    finally:
        close_shared_pools()
        if any(RETRY_IMAGE in image.tags for image in docker_client.images.list()):
            docker_client.images.remove(RETRY_IMAGE)
