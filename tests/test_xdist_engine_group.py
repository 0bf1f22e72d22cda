"""`make test`'s split, run for real (pytest-xdist, two workers) on a project of three tests.

Only the tests marked ``engine`` may queue on the engine worker, the run's critical path: a
module that also holds refusals or transformers checks once sent them all there (about 110 s
of the suite's engine worker, 2026-12-06).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = {
    "pytest.ini": f"[pytest]\npythonpath = {REPO}\nmarkers =\n    engine: starts an engine\n",
    "conftest.py": "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n",
    "test_a_plain.py": "def test_plain():\n    pass\n",
    "test_b_mixed.py": "import pytest\n\n\ndef test_refusal():\n    pass\n\n\n"
    "@pytest.mark.engine\ndef test_engine():\n    pass\n",
}


def test_only_engine_marked_tests_join_the_engine_group(tmp_path: Path) -> None:
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup",
         "--no-loadscope-reorder", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    passed = {line.split()[-1] for line in done.stdout.splitlines() if " PASSED " in line}
    assert passed == {
        "test_b_mixed.py::test_engine@vllm-engines",
        "test_b_mixed.py::test_refusal@test_b_mixed.py",  # its module's group, not the engines'
        "test_a_plain.py::test_plain@test_a_plain.py",
    }, done.stdout[-3000:]
