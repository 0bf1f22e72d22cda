"""The docs' Python snippets run as a new user pastes them, and print what the docs say.

Why: a snippet that raises (a renamed keyword, a moved import) is the first thing a user
meets, and nothing else runs the docs. Every ```python block of README.md and of the pages
under docs/ (a fence at the start of its line: an indented one, inside a list item, shows a
value, not code to paste) carries a marker on the line above it that says how it is checked:

- ``<!-- docs-test: run -->``: run as a script; each ``print(...)  # TEXT`` line must print
  TEXT's part before its first ``:`` (the rest is the page's explanation);
- ``<!-- docs-test: import -->``: imported, not run: its code under ``if __name__ ==
  "__main__":`` needs what a test machine lacks (a vLLM engine, a model, remote servers or
  Docker hosts), so this checks its imports and module-level code (the README's
  ``GRPOConfig`` is built and validated there);
- ``<!-- docs-test: docker -->``: run as ``run`` is, where a Docker daemon and the sandbox
  image are ready (``require_docker``: a skip, or a failure in CI, which has both);
- ``<!-- docs-test: compile -->``: another library's code shown beside ours (TRL's run, for
  comparison): compiled only, as its names are that library's and it needs a GPU;
- ``<!-- docs-test: mcp -->``: run as ``run`` is, while the example notes server serves
  streamable HTTP (``python examples/mcp_server.py --http 8765``, as the MCP page says; here on
  a free port, put in place of the page's ``MCP_HTTP_URL``).

Each runs in a fresh interpreter with a temporary working folder, as a pasted script would,
with this virtual environment's scripts on ``PATH`` (``mcp-server-time`` ...), as when it is
activated.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import require
from tests.mcp.conftest import example_notes_server
from tests.sandboxes.conftest import require_docker

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(
    r"^(?:<!-- docs-test: (\S+) -->\n)?```python\n(.*?)^```", re.MULTILINE | re.DOTALL
)
_PRINTS = re.compile(r"^\s*print\(.*\)\s+# ([^:\n]+)", re.MULTILINE)
KINDS = {"run", "import", "docker", "mcp", "compile"}
MCP_HTTP_URL = "http://127.0.0.1:8765/mcp"  # the MCP page's; the test serves another port


@dataclass(frozen=True)
class Snippet:
    page: str  # relative to the repository root
    line: int  # of the opening fence
    kind: str | None
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def expected_lines(self) -> list[str]:
        """What its commented print lines say they print, in order."""
        return [m.strip() for m in _PRINTS.findall(self.code)]


def page_snippets(name: str, text: str) -> list[Snippet]:
    """The ```python blocks of page ``name``, each with the marker above its fence (or None)."""
    return [
        Snippet(name, text.count("\n", 0, m.start(2)), m.group(1), m.group(2))
        for m in _BLOCK.finditer(text)
    ]


SNIPPETS = [
    snippet
    for page in PAGES
    for snippet in page_snippets(page.relative_to(ROOT).as_posix(), page.read_text())
]
CHECKED = [s for s in SNIPPETS if s.kind in KINDS]


def test_every_docs_python_snippet_says_how_it_is_checked():
    unmarked = [s.where for s in SNIPPETS if s.kind not in KINDS]
    assert not unmarked, (
        f"python blocks without a known marker at {', '.join(unmarked)}: put "
        f"'<!-- docs-test: {'|'.join(sorted(KINDS))} -->' on the line above each fence "
        "(see tests/test_docs_snippets.py)"
    )
    pages = {s.page for s in SNIPPETS}
    assert {"README.md", "docs/trainer.md", "docs/envs/mcp.md"} <= pages
    assert any(s.kind == "run" for s in SNIPPETS)


def test_snippets_are_read_with_their_marker_and_fence_line():
    text = (
        "# T\n<!-- docs-test: run -->\n```python\nprint(1)\n```\n\n"
        "```python\nx = 1\n```\n  ```python\n  {'a': 1}\n  ```\n"
    )
    found = [(s.line, s.kind, s.code) for s in page_snippets("page.md", text)]
    assert found == [(3, "run", "print(1)\n"), (7, None, "x = 1\n")]


def test_expected_lines_are_read_from_print_comments():
    code = "print(1)   # 1: why\nprint(x.stdout)  # 0.5 failed None\nprint(2)\n"
    assert Snippet("README.md", 1, "run", code).expected_lines == ["1", "0.5 failed None"]


def run_snippet(snippet: Snippet, folder: Path) -> subprocess.CompletedProcess[str]:
    """Run (or, for ``import``, import) the snippet in ``folder``, venv scripts on PATH."""
    (folder / "snippet.py").write_text(snippet.code)
    argv = ["-c", "import snippet"] if snippet.kind == "import" else ["snippet.py"]
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return subprocess.run(
        [sys.executable, *argv],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": path},
    )


@pytest.mark.parametrize("snippet", CHECKED, ids=lambda s: f"{s.where}-{s.kind}")
def test_docs_snippet_runs(snippet: Snippet, tmp_path: Path):
    if snippet.kind == "compile":
        compile(snippet.code, snippet.where, "exec")  # a SyntaxError names the page and line
        return
    if snippet.kind == "docker":
        require_docker()
    if snippet.kind == "mcp":
        require("mcp")
        assert MCP_HTTP_URL in snippet.code, f"{snippet.where} no longer names {MCP_HTTP_URL}"
        with example_notes_server() as url:  # on a free port: the page's may be taken
            done = run_snippet(dataclasses.replace(snippet, code=snippet.code.replace(
                MCP_HTTP_URL, url)), tmp_path)  # fmt: skip
    else:
        done = run_snippet(snippet, tmp_path)
    assert done.returncode == 0, f"{snippet.where} exited {done.returncode}:\n{done.stderr}"
    if snippet.kind != "import":
        printed = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        assert printed == snippet.expected_lines, f"{snippet.where} printed {printed}"
