"""What one sandbox call returns: `ExecResult` and its `ExecStatus`."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ExecStatus(enum.StrEnum):
    """How a call ended. Only ``SANDBOX_ERROR`` is an infrastructure failure."""

    OK = "ok"  # exited with code 0
    ERROR = "error"  # non-zero exit, uncaught exception, or killed by its own doing
    TIMEOUT = "timeout"  # ran past its timeout; killed inside the container
    OOM = "oom"  # hit the memory limit (kernel OOM kill or MemoryError)
    OUTPUT_LIMIT = "output_limit"  # wrote more than the output cap; killed at the cap
    SANDBOX_ERROR = "sandbox_error"  # the backend failed (daemon, container): not the code


@dataclass(frozen=True)
class ExecResult:
    """Result of `Sandbox.run` / `Sandbox.exec`.

    ``stdout``/``stderr`` are decoded as UTF-8 (invalid bytes replaced) and together hold at
    most the sandbox's output cap. ``exit_code`` is the process's exit status, negative when
    a signal killed it (``-9``), None when no status came back (``sandbox_error``).
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
    def infra_error(self) -> bool:
        """True when the sandbox itself failed; such a call must not be scored."""
        return self.status is ExecStatus.SANDBOX_ERROR

    @classmethod
    def sandbox_error(cls, message: str, duration: float = 0.0) -> ExecResult:
        """A result for a call the backend could not run."""
        return cls("", message, None, duration, ExecStatus.SANDBOX_ERROR)
