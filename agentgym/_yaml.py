"""`load_yaml`: YAML text to a value, or a one-line `ConfigError` saying where it came from.

Why: PyYAML's errors span several lines (the quoted line, a caret under it, a second mark),
and the CLIs print every user error as one line naming the fix. A config file, a ``--set``
value and a ``--grid`` axis all come through here.
"""

from __future__ import annotations

from typing import Any

import yaml

from ._errors import ConfigError


def load_yaml(text: str, source: str) -> Any:
    """The value ``text`` holds; ``source`` names it in the error (``"config 'a.yaml'"``).

    Raises:
        ConfigError: ``text`` is not YAML (JSON is YAML, so JSON text is read too).
    """
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ConfigError(f"{source} is not valid YAML{where}: {problem}") from None
