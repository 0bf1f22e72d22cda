"""`load_yaml`: YAML text to a value, or a one-line `ConfigError` saying where it came from.

Why: PyYAML's errors span several lines (the quoted line, a caret under it, a second mark),
and the CLIs print every user error as one line naming the fix. A config file, a ``--set``
value and a ``--grid`` axis all come through here.

Two YAML 1.1 rules that PyYAML follows are turned off, because they silently change what a
config says: ``10:50`` (a task range) is a base-60 number there (650), and a key written twice
keeps only its last value. Here ``10:50`` stays the string it looks like, and a repeated key
is an error.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ._errors import ConfigError

#: A base-60 number of YAML 1.1 (``10:50``, ``1:30.5``), from PyYAML's own int/float patterns.
_BASE_60 = r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$"
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader without base-60 numbers, and refusing a key given twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _without_base_60(tag: str, regexp: re.Pattern[str]) -> re.Pattern[str]:
    """PyYAML's pattern for ``tag``; for numbers, one that refuses what base 60 would read."""
    if tag not in _NUMBER_TAGS:
        return regexp
    return re.compile(f"(?!{_BASE_60}){regexp.pattern}", regexp.flags)


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, _without_base_60(tag, regexp)) for tag, regexp in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml(text: str, source: str) -> Any:
    """The value ``text`` holds; ``source`` names it in the error (``"config 'a.yaml'"``).

    Raises:
        ConfigError: ``text`` is not YAML (JSON is YAML, so JSON text is read too), it gives a
            key twice, or it nests deeper than the parser can follow.
    """
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise ConfigError(f"{source} is nested too deep to read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ConfigError(f"{source} is not valid YAML{where}: {problem}") from None
