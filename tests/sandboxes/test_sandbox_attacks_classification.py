"""Attacks on how a sandboxed sample is classified: passed, failed, or ``infra_error``.

Written as the policy being trained would try them, against the real Docker daemon and image.
A sample's code must not change its own outcome's class (a failure read as ``infra_error`` is
dropped from the group, unpunished) nor the class of the next sample judged in the same
sandbox (in GRPO, failing a group's other samples raises the attacker's advantage).
``test_sandbox_attacks*.py``, ``test_sandbox_verify.py`` and ``test_reuse_isolation.py`` hold
the attacks covered before.
"""

from __future__ import annotations

import time

import pytest

from agentgym.sandboxes import DockerSandbox, _docker, verify
from tests.sandboxes.conftest import require_docker

pytestmark = pytest.mark.docker

GOOD = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3"]
# 1.5-3 s of the candidate's own time leaves 300,000 folders in /tmp; removing them takes the
# next clean-up about 6x as long (8 s for 200,000 on the busy 2-core machine).
LEAVE_FOLDERS = """
import os, time
os.mkdir('/tmp/d')
stop, n = time.monotonic() + 3, 0
while n < 300_000 and time.monotonic() < stop:
    os.mkdir(f'/tmp/d/{n}')
    n += 1
"""


def test_folders_a_sample_leaves_do_not_time_out_the_next_sample(sb):
    # The clean-up before a verification removes what the last sample left, and used to run
    # on the next sample's clock: its runner timed out, and a correct sample scored 0.
    first = verify(LEAVE_FOLDERS + GOOD, TESTS, sandbox=sb)
    assert first.status != "infra_error", first.infra_error
    began = time.monotonic()
    # 5 s (was 2): the sample alone takes 0.05 s idle, far more on a saturated machine; the
    # timing below tells a clean-up on the sample's clock whatever the limits
    second = verify(GOOD, TESTS, sandbox=sb, per_test_timeout=5, total_timeout=5)
    took = time.monotonic() - began
    assert (second.status, second.reward) == ("passed", 1.0), (second.tests,
                                                               second.exec_result)
    # and the clean-up was not on its clock, however fast this machine deletes folders
    assert took - second.exec_result.duration > 1, (took, second.exec_result.duration)


def test_a_clean_up_past_its_limit_resets_the_sandbox_and_still_judges_the_sample(monkeypatch):
    # Past CLEAN_TIMEOUT_S the sandbox is reset hard (else replaced) and the call sent again:
    # the sample's code had not run, so it is judged as usual, never blamed for the leftovers.
    require_docker()
    monkeypatch.setattr(_docker, "CLEAN_TIMEOUT_S", 0.3)
    leave = "import os\nos.mkdir('/tmp/d')\nfor n in range(60_000): os.mkdir(f'/tmp/d/{n}')\n"
    with DockerSandbox() as box:
        assert box.run(leave, timeout=60).status == "ok"
        result = verify(GOOD, TESTS, sandbox=box, per_test_timeout=5, total_timeout=5)
        assert (result.status, result.reward) == ("passed", 1.0), result.exec_result
        assert box.needs_recycle  # the path taken: the clean-up was cut and the sandbox reset
