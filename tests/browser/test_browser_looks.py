"""How pages look in a real headless Chromium against the session's shared dashboard: the sessions
table fits a 1,400 px window, and the "Best is" in force reads as chosen."""

from __future__ import annotations

from pathlib import Path

from metrics_core.testing.live_server import wait_until
from tests.support import append_records, base_record


def served_runs(root: Path) -> None:
    """``resumed-looks``: three sessions with the long ids writers make, killed twice, each resume
    at a step an earlier session had passed."""
    for number, (start, end) in enumerate(((0, 300), (200, 700), (600, 1200))):
        session = f"2026-12-07T21:39:22-host{number}-pid{4000 + number}-3f2a9c1e7b"
        records = [base_record(start, event="session_start", session=session, discarded_bytes=17 * number)]
        records += [base_record(step, session=session, train_loss=3.0 / step, tokens=512)
                    for step in range(start + 10, end + 1, 10)]  # fmt: skip
        append_records(root / "resumed-looks" / "metrics.jsonl", *records)


GRID_OVERFLOW_JS = """() => {
  const grid = document.querySelector('[data-testid=stDataFrame] .dvn-scroller');
  return grid && grid.scrollWidth > 0 ? grid.scrollWidth - grid.clientWidth : null;
}"""


def test_the_sessions_table_fits_a_1400_px_window(page: object, server: str) -> None:
    """Every column of the sessions table is in view at 1,400 px: no sideways scroll."""
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{server}/sessions?run=resumed-looks")
    wait_until(page, lambda: page.evaluate(GRID_OVERFLOW_JS) is not None, timeout=30)
    overflow = page.evaluate(GRID_OVERFLOW_JS)
    assert overflow is not None and overflow <= 0, f"the table scrolls {overflow} px sideways"


LOOKS_JS = """() => Array.from(document.querySelectorAll('[data-testid=stButtonGroup] button[role=radio]'))
  .map(b => [b.innerText, b.getAttribute('aria-checked'), getComputedStyle(b).color])"""


def test_best_is_shows_the_choice_in_force_as_selected(page: object, server: str) -> None:
    """A metric picked on the runs page: "min" (a loss's best) is drawn selected (checked, in
    another colour than "max"); a click on "max" selects it instead, and the URL keeps it."""
    page.goto(f"{server}/?metric=train_loss&filter=resumed-looks")
    wait_until(page, lambda: len(page.evaluate(LOOKS_JS)) == 2, timeout=30)
    (low, low_checked, low_colour), (high, high_checked, high_colour) = page.evaluate(LOOKS_JS)
    assert (low, low_checked, high, high_checked) == ("min", "true", "max", "false") and low_colour != high_colour
    page.locator("[data-testid=stButtonGroup] button[role=radio]", has_text="max").click()
    wait_until(
        page, lambda: "best=max" in page.url and [c for *_, c, _ in page.evaluate(LOOKS_JS)] == ["false", "true"]
    )
