"""One row of `agentgym check`: a named check, its verdict and what it found."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CheckResult:
    """One named check: passed or not, and what it found.

    ``skipped`` marks a check that had nothing to check (an env without a reference
    solution): it counts as passed, so it never fails a run, yet a report must not show it
    as a pass. ``warning`` marks a pass with a caveat the user should read (a template that
    drops the text before a call, as the model family's own does). ``trace`` holds a
    failure's full traceback; ``detail`` stays one line per problem, readable in a table cell.
    """

    name: str
    passed: bool
    detail: str = ""
    skipped: bool = False
    trace: str = ""
    warning: bool = False

    @property
    def verdict(self) -> str:
        """What a report shows: ``pass``, ``warn``, ``skip`` or ``FAIL``."""
        if not self.passed:
            return "FAIL"
        if self.skipped:
            return "skip"
        return "warn" if self.warning else "pass"
