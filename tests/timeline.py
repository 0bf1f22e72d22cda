"""Which test this pytest process ran when: to name the test that left something behind.

A session-end check (leaked containers) runs once, after hundreds of tests, and pytest reports
its failure on whichever test the process ran last; `running_test_at` names the test that ran
when each leftover was made. A module of its own: pytest imports ``tests/conftest.py`` under
another name than the tests' ``tests.conftest``, and state kept there would exist twice.
"""

from __future__ import annotations

import time

#: (wall-clock start, node id) of each test this process ran, in order.
_STARTS: list[tuple[float, str]] = []


def started(nodeid: str) -> None:
    """Note that test ``nodeid`` starts now (the root conftest's ``pytest_runtest_logstart``)."""
    _STARTS.append((time.time(), nodeid))


def running_test_at(when: float) -> str:
    """The node id of the test this process was running at wall-clock time ``when``."""
    running = [nodeid for start, nodeid in _STARTS if start <= when]
    return running[-1] if running else "before the first test"
