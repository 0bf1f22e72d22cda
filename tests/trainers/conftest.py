"""Fixtures shared by the trainer tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def detach_run_logs() -> Iterator[None]:
    """A `RunDir` a test leaves open keeps a file handler on the ``agentgym`` logger; drop it."""
    logger = logging.getLogger("agentgym")
    before, level = list(logger.handlers), logger.level
    yield
    for handler in [h for h in logger.handlers if h not in before]:
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(level)
