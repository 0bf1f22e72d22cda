"""A new user reusing sandboxes to verify rewards (README section 4, docs/sandboxes.md).

What that journey hit, each checked here against the real daemon:

- A closed pool started "again" without a word (``pool.start()`` and ``with pool:`` returned
  it), and its next lease then said "not running (use `with pool:` or pool.start())": advice
  that could not work, in a loop.
- Leases still waiting when the pool closed were told "sandbox creation failed: the sandbox
  pool was closed", blaming a creation that never failed.
- A missing image other than the default said "build it with `agentgym sandbox build`",
  which builds only ``agentgym-sandbox:py3``, never the image asked for.
- ``SandboxPool(max_creates_per_second="5")`` (or a string ``health_interval_s`` /
  ``host_cooloff_s``) raised a bare ``TypeError``; nan passed; ``image=3`` or ``""`` was
  taken and failed only at the first container; ``size=0`` named three knobs at once.

What held up (not repeated here; other files test it): HumanEval samples that pass, fail,
loop, print megabytes, fork many processes, exit 0 early, forge report lines, kill or stop
every process of their uid (all ``failed``, never ``infra_error``); verifications cancelled
mid-flight (``wait_for``, ``task.cancel``) free their sandbox; a pool closed twice; the
local backend.
"""

from __future__ import annotations

import asyncio

import pytest

from agentgym._errors import ConfigError, SandboxError
from agentgym.sandboxes import DockerSandbox, SandboxPool, averify

pytestmark = pytest.mark.docker

CUSTOM_IMAGE = "agentgym-journey/never-built:1"


def test_a_closed_pool_does_not_start_again_and_says_to_make_a_new_one(docker_ready):
    pool = SandboxPool(size=1).start()
    pool.close()
    pool.close()  # twice: nothing to do, no raise
    with pytest.raises(SandboxError, match="closed; create a new SandboxPool"):
        pool.start()
    with pytest.raises(SandboxError, match="closed; create a new SandboxPool"):
        with pool:
            pass
    with pytest.raises(SandboxError, match="it was closed; create a new SandboxPool") as err:
        with pool.lease():
            pass
    assert "pool.start()" not in str(err.value)


def test_leases_waiting_when_the_pool_closes_are_told_it_closed(docker_ready):
    async def main() -> None:
        pool = SandboxPool(size=1)
        async with pool:
            async with pool.alease() as sb:  # the only sandbox: the next lease must wait
                assert (await sb.arun("print(1)")).stdout == "1\n"
                waiting = asyncio.create_task(
                    averify("def f():\n    return 1\n", ["assert f() == 1"], sandbox=pool))
                await asyncio.sleep(0)  # one turn of the loop: the lease is queued, not timed
                assert not waiting.done() and len(pool._waiters) == 1
                await asyncio.to_thread(pool.close)
                with pytest.raises(SandboxError) as err:
                    await waiting
        message = str(err.value)
        assert "closed while this lease waited" in message
        assert "creation failed" not in message

    asyncio.run(main())


def test_a_missing_custom_image_says_how_to_get_that_image(docker_ready):
    with pytest.raises(SandboxError) as err:
        DockerSandbox(image=CUSTOM_IMAGE).start()
    message = str(err.value)
    assert f"`docker pull {CUSTOM_IMAGE}`" in message
    assert f"`agentgym sandbox build --tag {CUSTOM_IMAGE}`" in message
    assert "\n" not in message
    with pytest.raises(SandboxError, match=f"--tag {CUSTOM_IMAGE}"):
        SandboxPool(size=1, image=CUSTOM_IMAGE).start()


@pytest.mark.parametrize(("make", "match"), [
    (lambda: SandboxPool(size=0), r"^size must be >= 1 \(the number of warm sandboxes\), got 0$"),
    (lambda: SandboxPool(max_uses=0), r"^max_uses must be >= 1 "),
    (lambda: SandboxPool(max_creates_per_second="5"), "max_creates_per_second must be a number"),
    (lambda: SandboxPool(max_creates_per_second=float("nan")), "max_creates_per_second .* nan"),
    (lambda: SandboxPool(health_interval_s="5"), "health_interval_s must be a number > 0"),
    (lambda: SandboxPool(host_cooloff_s=float("nan")), "host_cooloff_s must be a number > 0"),
    (lambda: SandboxPool(image=3), "image must be a Docker image reference"),
    (lambda: SandboxPool(image=""), "image must be a Docker image reference"),
    (lambda: DockerSandbox(image=None), "image must be a Docker image reference"),
    (lambda: DockerSandbox(image="my image"), "image must be a Docker image reference"),
])
def test_pool_and_sandbox_arguments_that_cannot_work_are_one_line_config_errors(make, match):
    with pytest.raises(ConfigError, match=match) as err:
        make()  # raised in the constructor: no container, no thread started
    assert "\n" not in str(err.value)
