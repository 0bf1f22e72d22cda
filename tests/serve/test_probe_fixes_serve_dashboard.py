"""The dashboard's run page on a long run, in a real headless Chromium.

130,000 metric lines: the page spread every point into ``Math.min(...)``, overflowed the call
stack and showed only that error, without curves or the trajectory list below them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgym._trajectory import to_json_line
from tests.serve.conftest import Dashboard, RunFolder, episode, other_run
from tests.serve.test_dashboard_browser import browser, open_view  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow  # starts Chromium and draws 130,000 points

STEPS = 130_000
SPIKE_STEP, SPIKE = 77_777, 5.0
#: Most points one drawn line may hold (the page's MAX_DRAWN, and the two ends).
MOST_DRAWN = 2002
#: Where the chart puts its plot area (the page's W, H and PAD).
LEFT, RIGHT, TOP = 46.0, 352.0, 8.0


@pytest.fixture
def long_run(dashboard: Dashboard, tmp_path: Path) -> Iterator[RunFolder]:
    """Train run ``long``: one reward per step, 0.1 to 0.9 but one spike, and two episodes."""
    lines = (
        json.dumps({"step": step, "reward/mean": SPIKE if step == SPIKE_STEP else step % 9 / 10})
        for step in range(STEPS)
    )
    episodes = to_json_line(episode(1, 2)) + to_json_line(episode(3, 4))
    files = {"metrics.jsonl": "\n".join(lines) + "\n", "eval_trajectories.jsonl": episodes}
    with other_run(dashboard, tmp_path / "long", "long", "train", files) as run:
        yield run


def _drawn(driver: Any, series: str) -> list[tuple[float, float]]:
    """The (x, y) points of a drawn line, after checking that it holds every point read."""
    line = driver.find_element("css selector", f'polyline[data-series="{series}"]')
    assert line.get_attribute("data-points") == str(STEPS)  # every point was read
    return [tuple(map(float, xy.split(","))) for xy in line.get_attribute("points").split()]


def test_a_run_of_130000_steps_shows_its_curve_and_its_episodes(
    browser: Any,  # noqa: F811  (the imported fixture)
    dashboard: Dashboard,
    long_run: RunFolder,
) -> None:
    open_view(browser, dashboard, f"/run/{long_run.id}")  # fails on the page's error
    assert not browser.find_element("id", "error").text
    points = _drawn(browser, "reward/mean")
    assert len(points) <= MOST_DRAWN  # thinned for drawing: a panel is ~300 px wide
    assert points[0][0] == LEFT and points[-1][0] == RIGHT  # both ends kept
    assert min(y for _, y in points) == TOP  # and the one spike, at the top of the plot
    rows = browser.find_elements("css selector", "#trajectory-table tbody tr")
    assert len(rows) == 2
    # the name is isolated: a bidi override in it cannot reorder the status shown after it
    assert browser.find_element("css selector", "h1 > bdi").text == f"calc-{long_run.id}"
