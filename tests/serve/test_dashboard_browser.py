"""The dashboard page in a real headless Chromium (Selenium + the distribution's chromedriver).

What a user sees: the runs table lists a finished run; a curve draws that run's points and
grows when the run writes a new metrics line; the trajectory viewer shows a tool call, its
result and the loss mask; model output with ``<script>`` stays text. Screenshots go to the
test's tmp dir and, when ``$AGENTGYM_TEST_ARTIFACTS`` is set, to ``dashboard/`` under it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require, skip_or_fail
from tests.serve.conftest import Dashboard, eval_run, metrics_line, sick_run

pytestmark = pytest.mark.slow  # starts Chromium (a few seconds on a loaded machine)
WAIT_S = 20


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium driven by the system chromedriver (no download, no Selenium Manager)."""
    webdriver = require("selenium.webdriver")
    service_module = require("selenium.webdriver.chrome.service")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        skip_or_fail("chromium and chromedriver are not installed (apt-get install chromium "
                     "chromium-driver)")  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                 "--disable-dev-shm-usage"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=service_module.Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shot(browser: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[str], Path]:
    """Save a screenshot named after the test (and copy it to the CI artifacts folder)."""

    def save(name: str) -> Path:
        path = tmp_path / f"{request.node.name}-{name}.png"
        browser.save_screenshot(str(path))
        if artifacts := os.environ.get("AGENTGYM_TEST_ARTIFACTS"):
            target = Path(artifacts) / "dashboard"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target / path.name)
        return path

    return save


def wait_for(browser: Any, condition: Callable[[Any], Any], what: str) -> Any:
    """Poll ``condition(browser)`` until truthy; fail naming ``what`` after `WAIT_S` seconds."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(browser, WAIT_S).until(condition)
    except TimeoutException:
        errors = browser.find_element("id", "error").text
        pytest.fail(f"timed out waiting for {what}; page error: {errors!r}")


def open_view(browser: Any, dashboard: Dashboard, hash_: str) -> None:
    """Load the page at ``#hash_`` afresh and wait until the view has rendered.

    Via a blank page: a get of the URL the browser is already on changes nothing, so a
    test would start from the last one's filled-in form.
    """
    browser.get("about:blank")
    browser.get(f"{dashboard.url}/#{hash_}")
    wait_for(
        browser,
        lambda b: b.find_element("id", "app").get_attribute("data-ready") == f"#{hash_}",
        f"view #{hash_}",
    )


def points_of(browser: Any, series: str) -> int:
    lines = browser.find_elements("css selector", f'polyline[data-series="{series}"]')
    return len(lines[0].get_attribute("points").split()) if lines else 0


def test_runs_table_lists_the_finished_run(browser: Any, dashboard: Dashboard, shot: Any) -> None:
    open_view(browser, dashboard, "/")
    row = browser.find_element("css selector", 'tr[data-run="a"]')
    cells = [td.text for td in row.find_elements("tag name", "td")]
    assert cells[1:6] == ["a", "calc-a", "train", "finished", "5"]
    assert browser.find_elements("css selector", 'tr[data-run="bb"]')
    assert shot("runs").stat().st_size > 0


def test_curve_draws_the_runs_points_and_grows_live(
    browser: Any, dashboard: Dashboard, shot: Any
) -> None:
    run = dashboard.store.runs["a"]
    open_view(browser, dashboard, "/run/a")
    assert points_of(browser, "reward/mean") == len(run.rewards)
    panels = [p.get_attribute("data-title") for p in browser.find_elements("class name", "panel")]
    assert "Tool error rate" in panels and "Entropy" in panels
    functions = browser.find_elements("css selector", 'polyline[data-series^="reward/correct"]')
    assert len(functions) == 1
    shot("curves")
    with (run.path / "metrics.jsonl").open("a") as f:
        f.write(metrics_line(len(run.rewards) + 1, 0.9))
    run.rewards.append(0.9)
    wait_for(browser, lambda b: points_of(b, "reward/mean") == len(run.rewards), "a new point")


def test_a_train_runs_page_shows_its_health(
    browser: Any, dashboard: Dashboard, tmp_path: Path, shot: Any
) -> None:
    open_view(browser, dashboard, "/run/a")
    healthy = wait_for(browser, lambda b: b.find_element("id", "health").text, "the health box")
    assert healthy == "no known problem in its figures"
    with sick_run(dashboard, tmp_path):
        open_view(browser, dashboard, "/run/sick")
        finding = wait_for(browser, lambda b: b.find_elements("css selector", "li.finding"),
                           "a finding")  # fmt: skip
        assert finding[0].text.startswith("[tool-errors] many tool calls fail: 60% of tool calls")
        assert "fix: read them: `agentgym runs episodes RUN --tool-errors`" in finding[0].text
        shot("health")
    with eval_run(dashboard, tmp_path / "eval"):  # an eval's episodes are read the same way
        open_view(browser, dashboard, "/run/ev")
        finding = wait_for(browser, lambda b: b.find_elements("css selector", "li.finding"),
                           "an eval's finding")  # fmt: skip
        assert finding[0].text.startswith("[tool-errors] many tool calls fail: 67% of tool calls")
        assert "fix: read them: `agentgym runs episodes OUT --tool-errors`" in finding[0].text


def test_two_runs_are_overlaid(browser: Any, dashboard: Dashboard, shot: Any) -> None:
    open_view(browser, dashboard, "/")
    for run_id in ("a", "bb"):
        browser.find_element("css selector", f'tr[data-run="{run_id}"] input').click()
    browser.find_element("id", "compare-button").click()
    wait_for(browser, lambda b: points_of(b, "calc-bb: reward/mean") == 4, "run bb's curve")
    assert points_of(browser, "calc-a: reward/mean") == len(dashboard.store.runs["a"].rewards)
    shot("compare")


def test_viewer_shows_tool_call_result_and_loss_mask(
    browser: Any, dashboard: Dashboard, shot: Any
) -> None:
    open_view(browser, dashboard, "/run/a")
    rows = browser.find_elements("css selector", "#trajectory-table tbody tr")
    assert len(rows) == len(dashboard.store.runs["a"].trajectories)
    rows[0].click()
    wait_for(browser, lambda b: b.find_elements("id", "loss-mask"), "the trajectory detail")
    call = browser.find_element("css selector", ".tool-call")
    assert "tool call calculate" in call.text and '"expression": "40 + 50"' in call.text
    result = browser.find_element("css selector", ".tool-result")
    assert (
        "result of call_1_0" in result.text and result.find_element("tag name", "pre").text == "90"
    )

    ids, mask, _ = dashboard.store.runs["a"].trajectories[0].flatten()
    tokens = browser.find_elements("css selector", "#loss-mask .tok[title]")
    assert len(tokens) == len(ids)
    assert [int(t.get_attribute("class")[-1]) for t in tokens] == mask
    trained = "".join(
        t.get_attribute("textContent") for t in tokens if t.get_attribute("class") == "tok m1"
    )
    assert trained.startswith("<tool_call>") and trained.endswith("The answer is 90.")
    browser.execute_script("document.getElementById('loss-mask').scrollIntoView()")
    shot("trajectory")


@pytest.mark.parametrize(
    ("box", "index"), [("tool_errors", "6"), ("results_cut", "2"), ("turns_cut", "7")]
)
def test_filter_by_a_checkbox(browser: Any, dashboard: Dashboard, box: str, index: str) -> None:
    open_view(browser, dashboard, "/run/a")
    browser.find_element("css selector", f'#filters input[name="{box}"]').click()
    browser.find_element("css selector", '#filters button[type="submit"]').click()
    wait_for(browser, lambda b: "1 of 1 matching" in b.find_element("id", "page-info").text,
             "the filtered page")  # fmt: skip
    rows = browser.find_elements("css selector", "#trajectory-table tbody tr")
    assert [r.get_attribute("data-index") for r in rows] == [index]


def test_model_output_with_markup_stays_text(browser: Any, dashboard: Dashboard, shot: Any) -> None:
    open_view(browser, dashboard, "/run/a/traj/9")
    user = browser.find_elements("css selector", "#messages .msg")[1]
    assert "<script>window.__xss = 1</script><img src=x onerror=" in user.text
    assert browser.execute_script("return window.__xss") is None
    assert not browser.find_elements("css selector", "#messages img, #messages script")
    shot("xss")
