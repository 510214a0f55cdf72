"""The runs table as Streamlit draws it on the runs page: its column config, the page of rows the
filters and page picker select (``RunsPage``, compared before a redraw) and the grid whose click
opens a run.  What goes into the rows is ``runs_table``'s, pure pandas; this module holds what
needs Streamlit, so ``runs_table`` stays testable without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from metrics_core.dashboard.display_text import md_text, next_age_change
from metrics_core.dashboard.views.config_tables import runs_table
from metrics_core.dashboard.views.runs_table import (
    PAGE_ROWS,
    STATUS_BADGES,
    STATUS_COLOURS,
    filter_runs,
    readable_runs,
    run_links,
    runs_page,
    status_pills,
)
from metrics_core.dashboard.widgets import SAME_TAB_JS, SAME_TAB_KEY

RUNS_COLUMNS = {
    "status": st.column_config.MultiselectColumn(
        "status",
        options=list(STATUS_BADGES.values()),
        color=[STATUS_COLOURS[status] for status in STATUS_BADGES],
        help="live, stalled (no record for a while), finished, interrupted, failed, crashed (ended without "
        "saying so), error (cannot be read), unreadable (an entry of the root that cannot be looked into)",
    ),
    "run": st.column_config.LinkColumn(
        "run", display_text=r"run=(.*)$", help="Click a run (or tick its row): it opens here"
    ),
    "loss trend": st.column_config.LineChartColumn("loss trend", width="small", help="train loss, whole run"),
    "error": st.column_config.TextColumn(
        "error",
        help="why it stopped (the exception and the rank it came from, the signal, the failed write), "
        "or why it cannot be read",
    ),
}


@dataclass(frozen=True, eq=False)
class RunsPage:
    """One page of the runs table exactly as the runs page draws it, with what the page's filters
    and page picker made of the store's table: the live fragment builds one per change and redraws
    the page only when it differs from the one drawn (``same_as``), so runs changing off the page,
    or in a way the page does not show, never redraw it (nor lose a click on it)."""

    rows: pd.DataFrame  # the dataframe's data: readable values, status pills, run links
    names: tuple[str, ...]  # the run of each row, in drawn order
    total: int  # runs after the filters
    page: int
    pages: int
    errors: tuple[str, ...]  # what the filters could not apply, in plain text
    ages_change_at: float  # time.time() at which an age shown ("18 s ago") next reads differently

    def same_as(self, other: RunsPage | None) -> bool:
        """Whether drawing ``other`` instead would show exactly the same (O(page rows))."""
        return (
            other is not None
            and (self.total, self.page, self.pages, self.errors) == (other.total, other.page, other.pages, other.errors)
            and self.rows.equals(other.rows)
        )


def runs_page_view(table: pd.DataFrame) -> RunsPage:
    """The page of ``table`` (the store's runs page) the filters, config columns and page picker of
    the runs page select, read from their session state: O(runs) to filter and sort, O(``PAGE_ROWS``)
    to format."""
    state = st.session_state
    shown, name_error = filter_runs(table, state.get("run_filter", ""))
    shown, config_error = runs_table(
        shown, keys=state.get("config_columns", []), config_filter=state.get("config_filter", "")
    )
    rows, page, pages = runs_page(shown, state.get("runs_page", 1))
    readable = readable_runs(rows)
    return RunsPage(
        rows=status_pills(run_links(readable)),
        names=tuple(readable["run"]),
        total=len(shown),
        page=page,
        pages=pages,
        errors=tuple(error for error in (name_error, config_error) if error),
        ages_change_at=time.time() + next_age_change(rows["last record age (s)"]),
    )


def runs_table_view(shown: RunsPage, drawn: RunsPage | None) -> None:
    """The runs table, one page of ``PAGE_ROWS`` at a time (newest activity first), with a page
    picker when there is more than one page; a click on a run's link (``SAME_TAB_JS``), or a tick
    on its row, opens that run in this tab.  ``drawn``: the page drawn before, which a tick's row
    number refers to (this run's rows may have moved since the click)."""
    for error in shown.errors:
        st.error(md_text(error))
    if shown.pages > 1:  # one page drawn: a live update of a big root redraws PAGE_ROWS rows, not every run
        st.session_state["runs_page"] = shown.page  # clamped: a filter that leaves fewer pages never overflows
        where, which = st.columns([4, 1], vertical_alignment="bottom")
        first = (shown.page - 1) * PAGE_ROWS + 1
        where.caption(
            f"Showing {first:,}–{first + len(shown.names) - 1:,} of {shown.total:,} runs, newest activity first"
        )
        which.number_input("Page", min_value=1, max_value=shown.pages, step=1, key="runs_page")
    with st.container(key=SAME_TAB_KEY):
        st.html(SAME_TAB_JS, unsafe_allow_javascript=True)
    picked = st.dataframe(
        shown.rows,
        hide_index=True,
        width="stretch",
        key="runs_table",
        on_select="rerun",
        selection_mode="single-row",
        column_config=RUNS_COLUMNS,
    )
    names = (drawn or shown).names
    if picked.selection.rows and picked.selection.rows[0] < len(names):
        st.switch_page("pages/run.py", query_params={"run": names[picked.selection.rows[0]]})
