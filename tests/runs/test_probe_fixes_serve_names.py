"""``agentgym runs ls/show/compare`` on run names holding Unicode format characters.

A bidi override (U+202E) printed raw reversed what the terminal showed (``gnp.exe`` read
``exe.png``, and the cells after it); zero-width characters hid text. They are shown as
``\\uNNNN`` escapes, as control characters are shown as ``\\xNN``; other text is kept.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

from agentgym.runs import RunStore
from tests.runs.test_probe_fixes_cli import eval_folder, indexed, runs_cli

#: Override, isolate, zero-width space and joiner; text around them that must stay as it is.
NAME = "ok \u202egnp.exe\u202c \u2067x\u2069 a\u200bb \u00e9t\u00e9 \u4e2d d\u200de"
SHOWN = "ok \\u202egnp.exe\\u202c \\u2067x\\u2069 a\\u200bb \u00e9t\u00e9 \u4e2d d\\u200de"


def test_format_characters_in_names_are_shown_as_escapes(tmp_path: Path, db: str) -> None:
    store = RunStore(db)
    first = indexed(store, eval_folder(tmp_path / "a", "4"), "b1b1b1b1b1b1", name=NAME)
    second = indexed(store, eval_folder(tmp_path / "b", "5"), "c2c2c2c2c2c2", name="plain")
    for args in (("ls",), ("show", first), ("compare", first, second)):
        shown = runs_cli("runs", *args, db=db, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        hidden = {c for c in shown.stdout if unicodedata.category(c) == "Cf"}
        assert not hidden, (args, sorted(map(hex, map(ord, hidden))))
        assert SHOWN in shown.stdout, (args, shown.stdout)
