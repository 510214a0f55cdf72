"""A big run opened cold: the page shows its title and the read's progress before the run is read,
and its charts replace the progress once it is.  A root of its own, served without a columnar
cache, so every read is cold: copies of one generated run, one per test, each made as its test
starts."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrics_core.read.read_progress import byte_text
from metrics_core.testing.generate import write_run
from metrics_core.testing.live_server import live_charts_drawn, streamlit_server, wait_until

RECORDS = 400_000  # ~190 MB: read in seconds on a small machine, far over what a page's call reads itself

# In the page: the read progress bars shown, as (value, text) pairs, and the page's titles.
READING_JS = """() => ({
  bars: [...document.querySelectorAll('[class*="st-key-run_reading"]')].map(box => {
    const bar = box.querySelector('[role=progressbar]');
    return {value: bar ? bar.getAttribute('aria-valuenow') : null, text: box.innerText};
  }),
  titles: [...document.querySelectorAll('h1')].map(h => h.innerText),
})"""


# In the page: whether a chart holds a point (the compare page's charts are drawn, empty, at once).
POINTS_JS = "[...document.querySelectorAll('.js-plotly-plot')].some(g => (g.data || []).some(t => t.x && t.x.length))"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The big run, written once, outside the served root."""
    path = tmp_path_factory.mktemp("generated") / "metrics.jsonl"
    write_run(path, RECORDS)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("progress")


def new_run(root: Path, generated: Path, name: str) -> str:
    """A copy of the big run under ``root`` as ``name``, made just before its page opens: the server's
    alerter, which reads every run it lists, has not read it by then."""
    (root / name).mkdir()
    shutil.copyfile(generated, root / name / "metrics.jsonl")
    return name


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[str]:
    with streamlit_server(root, "--no-cache") as url:
        yield url


def reading(page: object) -> dict:
    return page.evaluate(READING_JS)


def shown_reading(page: object, saying: str = "") -> dict:
    """The page's state once a progress bar whose text holds ``saying`` is shown (fails after the
    deadline).  A bar first says the file is being opened, then how many bytes of it are read."""

    def says() -> dict | None:
        state = reading(page)
        text = state["bars"][0]["text"] if state["bars"] else ""
        return state if text and saying in text else None

    return wait_until(page, says, timeout=60)


def test_a_big_run_page_shows_its_title_and_read_progress_then_its_charts(
    server: str, root: Path, generated: Path, page: object
) -> None:
    """/run of a big run not read yet: its title and a progress bar saying bytes read of the file's
    size, before any chart; then the charts, and the bar is gone."""
    page.goto(f"{server}/run?run={new_run(root, generated, 'big')}")
    size = byte_text((root / "big" / "metrics.jsonl").stat().st_size)
    shown = shown_reading(page, saying=f" of {size}")
    assert "big" in shown["titles"][0]
    [bar] = shown["bars"]
    assert "Reading run 'big'" in bar["text"] and f" of {size}" in bar["text"]
    assert not live_charts_drawn(page)
    wait_until(page, lambda: live_charts_drawn(page), timeout=120)
    assert reading(page)["bars"] == []


def test_the_sessions_page_shows_its_own_title_while_its_run_is_read(
    server: str, root: Path, generated: Path, page: object
) -> None:
    """/sessions of a big run not read yet: "Sessions of …" and the bar, then the page itself."""
    page.goto(f"{server}/sessions?run={new_run(root, generated, 'big-sessions')}")
    shown = shown_reading(page)
    assert shown["titles"][0].startswith("Sessions of big-sessions")
    wait_until(page, lambda: live_charts_drawn(page), timeout=120)
    assert reading(page)["bars"] == []


def test_the_compare_page_shows_a_run_being_read_where_its_charts_go(
    server: str, root: Path, generated: Path, page: object
) -> None:
    """/compare of a big run not read yet: the page's title and controls at once, the run's progress
    bar in the chart area, then the run's lines in the charts."""
    page.goto(f"{server}/compare?run={new_run(root, generated, 'big-compare')}")
    shown = shown_reading(page)
    assert shown["titles"][0] == "Compare runs"
    assert "Reading run 'big-compare'" in shown["bars"][0]["text"]
    wait_until(page, lambda: not reading(page)["bars"], timeout=120)  # the page's charts (empty till now) get the run
    wait_until(page, lambda: page.evaluate(POINTS_JS), timeout=60)
