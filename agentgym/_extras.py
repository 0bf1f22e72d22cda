"""A missing optional dependency, said in one line that names the extra to install.

The base install (`pip install agentgym`) runs envs, scripted evals and the run store; the
trainer, the job server and the sandboxes need extras. A command started without its extra
should say which one, not show a traceback ending in ``No module named 'torch'``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ._errors import ConfigError

#: The top-level modules each extra brings (pyproject.toml's optional dependencies).
EXTRA_MODULES: dict[str, frozenset[str]] = {
    "train": frozenset({
        "torch", "transformers", "tokenizers", "peft", "trl", "accelerate", "datasets",
        "matplotlib", "tensorboard",
    }),
    "tools": frozenset({"mcp", "fastapi", "uvicorn", "bm25s", "starlette"}),
}  # fmt: skip


@contextlib.contextmanager
def needs_extra(what: str, extra: str) -> Iterator[None]:
    """Imports inside become one `ConfigError` naming ``extra`` when one of its modules is missing.

    A module missing that the extra does not bring is re-raised as it is: that is a bug or a
    broken install, and its own traceback says more.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in EXTRA_MODULES[extra]:
            raise
        raise ConfigError(
            f"{what} needs the {extra!r} extra (no module {exc.name!r}): "
            f"pip install 'agentgym[{extra}]'"
        ) from None
