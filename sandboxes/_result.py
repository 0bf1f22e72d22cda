"""What one sandbox call returns: `ExecResult` and its `ExecStatus`."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ExecStatus(enum.StrEnum):
    """How a call ended. Only ``INFRA_ERROR`` is a failure of the machinery, not of the code.

    ``"infra_error"`` is the word for that everywhere: `VerifyResult.status`, a
    `Trajectory`'s status, and ``result.infra_error`` (the reason) on both result types.
    """

    OK = "ok"  # exited with code 0
    ERROR = "error"  # non-zero exit, uncaught exception, or killed by its own doing
    TIMEOUT = "timeout"  # ran past its timeout; killed inside the container
    OOM = "oom"  # hit the memory limit (kernel OOM kill or MemoryError)
    OUTPUT_LIMIT = "output_limit"  # wrote more than the output cap; killed at the cap
    INFRA_ERROR = "infra_error"  # the backend failed (daemon, container): not the code


@dataclass(frozen=True)
class ExecResult:
    """Result of `Sandbox.run` / `Sandbox.exec`.

    ``stdout``/``stderr`` are decoded as UTF-8 (invalid bytes replaced) and together hold at
    most the sandbox's output cap. ``exit_code`` is the process's exit status, negative when
    a signal killed it (``-9``), None when no status came back (``infra_error``).
    ``duration`` is wall-clock seconds measured inside the sandbox (host time for errors).
    ``truncated`` is True when output past the cap was discarded.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    duration: float
    status: ExecStatus
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the code exited with status 0."""
        return self.status is ExecStatus.OK

    @property
    def infra_error(self) -> str | None:
        """What failed, when the sandbox itself failed (such a call must not be scored).

        None otherwise: the same field, type and meaning as `VerifyResult.infra_error`.
        """
        if self.status is not ExecStatus.INFRA_ERROR:
            return None
        return self.stderr.strip() or "sandbox failure"

    @classmethod
    def infra_failure(cls, message: str, duration: float = 0.0) -> ExecResult:
        """A result for a call the backend could not run."""
        return cls("", message, None, duration, ExecStatus.INFRA_ERROR)
