"""the runs page's SQL box in a real headless Chromium against a real `streamlit run`: a SELECT
shows its rows as a table with a CSV download; a statement that writes shows one line of error, and
the runs table above it is still there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metrics_core.testing.live_server import GRID_JS, RUN_ROWS_JS, sign_in, streamlit_server, wait_until
from tests.support import small_run, three_session_run

pytest.importorskip("duckdb", reason="duckdb (the sql extra) is not installed")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A dashboard of its own: the query answers over every run of the root, here exactly ``a`` and ``b``."""
    root = tmp_path_factory.mktemp("sql_runs")
    three_session_run(root / "a" / "metrics.jsonl")
    small_run(root / "b" / "metrics.jsonl")
    with streamlit_server(root) as url:
        yield url


def ask(page: object, sql: str) -> None:
    page.get_by_label("Query").fill(sql)
    page.get_by_role("button", name="Run query").click()


def test_the_query_box_answers_a_select_and_refuses_a_delete(server: str, page: object) -> None:
    """SELECT over the runs view: its rows in a data grid and a CSV download of them; then DELETE: one
    line of error in place of the rows, and the runs table still lists both runs."""
    page.goto(server + "/")
    wait_until(page, lambda: len(page.evaluate(RUN_ROWS_JS)["names"]) == 2, timeout=60)
    ask(page, "SELECT run, sessions, last_step FROM runs ORDER BY run")
    rows = wait_until(page, lambda: (grids := page.evaluate(GRID_JS, ".st-key-sql_answer")) and grids[0], timeout=60)
    assert [row[-3:] for row in rows] == [["run", "sessions", "last_step"], ["a", "3", "200"], ["b", "1", "500"]]
    sign_in(page, server)  # a download carries the browser's cookie, not the test's Bearer header
    with page.expect_download() as download:
        page.get_by_role("button", name="Download CSV").click()
    assert Path(download.value.path()).read_text() == "run,sessions,last_step\na,3,200\nb,1,500\n"
    ask(page, "DELETE FROM records")
    error = page.locator(".st-key-sql_answer [data-testid=stAlertContentError] [data-testid=stMarkdownContainer]")
    wait_until(page, lambda: error.count() == 1, timeout=60)
    assert (
        error.inner_text().strip()
        == "Query failed: refused: a DELETE statement; only reading queries (SELECT) are allowed"
    )
    assert page.locator(".st-key-sql_answer [data-testid=stDataFrame]").count() == 0
    assert sorted(page.evaluate(RUN_ROWS_JS)["names"]) == ["run?run=a", "run?run=b"]
