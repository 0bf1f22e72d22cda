"""Run-store fixtures: a fresh database of each backend (SQLite file, real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runs.postgres import BACKENDS, backend_url


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty database, once per backend."""
    return backend_url(request.param, tmp_path)


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A SQLite run store of the test's own, for the console script (`tests.runs.cli`)."""
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture(autouse=True)
def close_every_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close each `RunStore` a test opened (open PostgreSQL connections warn when collected)."""
    from agentgym.runs import RunStore

    opened: list[RunStore] = []
    init = RunStore.__init__

    def tracked(self: RunStore, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        opened.append(self)

    monkeypatch.setattr(RunStore, "__init__", tracked)
    yield
    for store in opened:
        store.close()
