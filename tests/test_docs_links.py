"""Links between the README and docs/ lead somewhere: the file exists and so does the heading.

Docs are moved and retitled as the project grows; a link to a heading that was renamed fails
silently on GitHub (it opens the page at the top), so this checks the anchors the way GitHub
makes them from headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text())
    return {github_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def relative_links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text())
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_github_anchor_matches_githubs_rule():
    assert github_anchor("Adapter sync (`bench/trainer_bench.py --skip-step`)") == (
        "adapter-sync-benchtrainer_benchpy---skip-step"
    )
    assert github_anchor("On a GPU") == "on-a-gpu"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT)}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
