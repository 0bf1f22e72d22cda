"""`load_yaml`: YAML text to a value, or a one-line `ConfigError` saying where it came from.

Why: PyYAML's errors span several lines (the quoted line, a caret under it, a second mark),
and the CLIs print every user error as one line naming the fix. A config file, a ``--set``
value and a ``--grid`` axis all come through here.

Three YAML 1.1 rules that PyYAML follows are turned off, because they silently change what a
config says: ``10:50`` (a task range) is a base-60 number there (650), ``2024-01-01`` (a run
folder's name) is a date, which no knob takes, and a key written twice keeps only its last
value. Here the first two stay the strings they look like, and a repeated key is an error.
A value given on the command line (`load_cli_value`) has no comments either: ``#`` is a
character there, not the start of a comment that silently cut ``runs/exp #2`` to ``runs/exp``.
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
    first: [
        (tag, _without_base_60(tag, regexp))
        for tag, regexp in resolvers
        if tag != "tag:yaml.org,2002:timestamp"
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

#: Stands for ``#`` while a command-line value is parsed (a private-use character: printable
#: for YAML, and in no one's value).
_HASH = "\ue000"


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


def load_cli_value(text: str, source: str) -> Any:
    """`load_yaml` for one ``key=value`` value of a command line: ``#`` starts no comment."""
    return _with_hashes(load_yaml(text.replace("#", _HASH), source))


def _with_hashes(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace(_HASH, "#")
    if isinstance(value, list):
        return [_with_hashes(v) for v in value]
    if isinstance(value, dict):
        return {_with_hashes(k): _with_hashes(v) for k, v in value.items()}
    return value
