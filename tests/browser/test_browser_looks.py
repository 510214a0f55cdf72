"""How pages look in a real headless Chromium against the session's shared dashboard: the sessions
table fits a 1,400 px window, and a chosen "Best is" reads as chosen."""

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
