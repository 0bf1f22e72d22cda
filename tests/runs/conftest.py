"""Run-store fixtures: a fresh database of each backend (SQLite file, real PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runs.postgres import BACKENDS, backend_url


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty database, once per backend."""
    return backend_url(request.param, tmp_path)
