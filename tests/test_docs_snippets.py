"""The README's Python snippets run as a new user pastes them, and print what the README says.

Why: a snippet that raises (a renamed keyword, a moved import) is the first thing a new user
meets, and nothing else runs the README. Every ```python block in README.md carries a marker
on the line above it that says how it is checked here:

- ``<!-- docs-test: run -->``: run as a script; each ``print(...)  # TEXT`` line must print
  TEXT's part before its first ``:`` (the rest is the README's explanation);
- ``<!-- docs-test: import -->``: imported, not run: its code under ``if __name__ ==
  "__main__":`` starts a vLLM engine, so this checks its imports and module-level code (a
  ``GRPOConfig`` is built and validated there);
- ``<!-- docs-test: docker -->``: run as ``run`` is, where a Docker daemon and the sandbox
  image are ready (``require_docker``: a skip, or a failure in CI, which has both).

Each runs in a fresh interpreter with a temporary working folder, as a pasted script would.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.sandboxes.conftest import require_docker

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_BLOCK = re.compile(
    r"^(?:<!-- docs-test: (\w+) -->\n)?```python\n(.*?)^```", re.MULTILINE | re.DOTALL
)
_PRINTS = re.compile(r"^\s*print\(.*\)\s+# ([^:\n]+)", re.MULTILINE)
KINDS = {"run", "import", "docker"}


@dataclass(frozen=True)
class Snippet:
    line: int  # of the opening fence in README.md
    kind: str | None
    code: str

    @property
    def expected_lines(self) -> list[str]:
        """What its commented print lines say they print, in order."""
        return [m.strip() for m in _PRINTS.findall(self.code)]


def readme_snippets() -> list[Snippet]:
    text = README.read_text()
    return [
        Snippet(text.count("\n", 0, m.start(2)), m.group(1), m.group(2))
        for m in _BLOCK.finditer(text)
    ]


SNIPPETS = readme_snippets()
CHECKED = [s for s in SNIPPETS if s.kind in KINDS]


def test_every_readme_python_snippet_says_how_it_is_checked():
    unmarked = [s.line for s in SNIPPETS if s.kind not in KINDS]
    assert SNIPPETS and not unmarked, (
        f"README.md python blocks at lines {unmarked} lack a marker line above their fence: "
        "add '<!-- docs-test: run|import|docker -->' (see tests/test_docs_snippets.py)"
    )
    assert any(s.kind == "run" for s in SNIPPETS)


def test_expected_lines_are_read_from_print_comments():
    code = "print(1)   # 1: why\nprint(x.stdout)  # 0.5 failed None\nprint(2)\n"
    assert Snippet(1, "run", code).expected_lines == ["1", "0.5 failed None"]


@pytest.mark.parametrize("snippet", CHECKED, ids=lambda s: f"README.md:{s.line}-{s.kind}")
def test_readme_snippet_runs(snippet: Snippet, tmp_path: Path):
    if snippet.kind == "docker":
        require_docker()
    (tmp_path / "snippet.py").write_text(snippet.code)
    argv = ["-c", "import snippet"] if snippet.kind == "import" else ["snippet.py"]
    done = subprocess.run(
        [sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (
        f"README.md:{snippet.line} exited {done.returncode}:\n{done.stderr}"
    )
    if snippet.kind != "import":
        printed = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        assert printed == snippet.expected_lines, f"README.md:{snippet.line} printed {printed}"
