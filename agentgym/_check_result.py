"""One row of `agentgym check`: a named check, its verdict and what it found."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CheckResult:
    """One named check: passed or not, and what it found.

    ``skipped`` marks a check that had nothing to check (an env without a reference
    solution): it counts as passed, so it never fails a run, yet a report must not show it
    as a pass. ``trace`` holds a failure's full traceback; ``detail`` stays one line per
    problem, readable in a table cell.
    """

    name: str
    passed: bool
    detail: str = ""
    skipped: bool = False
    trace: str = ""

    @property
    def verdict(self) -> str:
        """What a report shows: ``pass``, ``skip`` or ``FAIL``."""
        if not self.passed:
            return "FAIL"
        return "skip" if self.skipped else "pass"
