"""``agentgym serve``: the HTTP job API (FastAPI on uvicorn) over the run store.

See ``docs/experiments.md``. `create_app` builds the app (FastAPI is imported on first use,
so the ``agentgym`` command stays quick to start).
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from ._app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
