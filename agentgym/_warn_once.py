"""One warning per failing piece of user code, however often it fails."""

from __future__ import annotations

import logging
from typing import Any

_warned: set[tuple[str, str]] = set()


def warn_once(log: logging.Logger, kind: str, name: str, message: str, *args: Any) -> None:
    """Log ``message`` the first time ``name`` (a tool, a reward function) fails in way ``kind``.

    Why once: such code fails on every call, and a run makes thousands of calls.
    """
    if (kind, name) not in _warned:
        _warned.add((kind, name))
        log.warning(message, *args)
