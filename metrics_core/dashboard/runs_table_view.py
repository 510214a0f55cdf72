"""The runs table as Streamlit draws it on the runs page: its column config, the controls of its
columns (config keys, the swept ones by default, and a metric's last and best value), the page of
rows the filters and page picker select (``RunsPage``, compared before a redraw) and the grid whose
link opens a run and whose ticked rows open together (one: its run; several: the compare page; or
the sweep page).  What goes into the rows is ``runs_table``'s and ``sweep``'s, pure pandas; this
module holds what needs Streamlit, so they stay testable without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from metrics_core.dashboard.controls.url_state import to_url, url_choice, url_flag, url_text, url_texts
from metrics_core.dashboard.display_text import md_text, next_age_change, shorten
from metrics_core.dashboard.views.chart_filter import FILTER_MAX_CHARS, RUN_FILTER_HELP
from metrics_core.dashboard.views.config_tables import (
    column_keys,
    config_keys,
    filter_by_config,
    table_configs,
    with_config_columns,
)
from metrics_core.dashboard.views.runs_table import (
    PAGE_ROWS,
    SORTS,
    STATUS_BADGES,
    STATUS_COLOURS,
    filter_runs,
    readable_runs,
    run_links,
    runs_page,
    sorted_runs,
    status_pills,
)
from metrics_core.dashboard.views.sweep import best_is_max, metric_keys, with_metric_columns
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
        "run", display_text=r"run=(.*)$", help="Click a run: it opens here; tick rows to open several together"
    ),
    "started": st.column_config.TextColumn("started", help="its first record, UTC"),
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
    listed: tuple[str, ...]  # every run the filters keep, on this page or another
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
    configs = table_configs(shown)
    shown, config_error = filter_by_config(shown.drop(columns="config"), configs, state.get("config_filter", ""))
    keys = column_keys(
        configs, shown["run"].tolist(), state.get("config_columns", []), swept=state.get("swept_columns", True)
    )
    metric = state.get("runs_metric")
    best_max = bool(metric) and (state.get("runs_best") or ("max" if best_is_max(metric) else "min")) == "max"
    order = lambda rows: sorted_runs(rows, state.get("runs_sort", "activity"), metric=metric, best_max=best_max)  # noqa: E731
    rows, page, pages = runs_page(shown, state.get("runs_page", 1), order=order)  # the columns below: the page's only
    rows = with_config_columns(rows, configs, keys)
    if metric:
        tails = dict(zip(rows["run"].tolist(), rows["metrics"].tolist(), strict=True))
        rows = with_metric_columns(rows, tails, metric, best_max=best_max)
    readable = readable_runs(rows, order=order)
    return RunsPage(
        rows=status_pills(run_links(readable)),
        names=tuple(readable["run"]),
        listed=tuple(shown["run"].tolist()),
        total=len(shown),
        page=page,
        pages=pages,
        errors=tuple(error for error in (name_error, config_error) if error),
        ages_change_at=time.time() + next_age_change(rows["last record age (s)"]),
    )


BEST_RULE = (
    "Chosen by the metric's name until you pick: the least value, or the greatest for a metric named like "
    "accuracy, F1, AUC, reward or throughput"
)
CONFIG_FILTER_HELP = (
    "Space-separated `key=value` or `key!=value` terms on the flattened config (`optim.lr`), all must "
    "hold; numbers compare as numbers (`3e-4` matches `0.0003`); quote a term holding a space."
)


SORT_HELP = "The order of every listed run, across pages; a metric's best or last puts the best first"


def filter_controls() -> None:
    """The runs page's two filters, by run name and by config, into session state
    (``runs_page_view`` reads them), seeded from and written to the URL (``?filter=``, ``?config=``)."""
    url_text("filter", "run_filter", max_chars=FILTER_MAX_CHARS)
    url_text("config", "config_filter", max_chars=FILTER_MAX_CHARS)
    by_name, by_config = st.columns(2)
    name = by_name.text_input(
        "Filter runs",
        key="run_filter",
        placeholder="e.g. ^llama*lr3e-4",
        help=RUN_FILTER_HELP,
        max_chars=FILTER_MAX_CHARS,
    )
    config = by_config.text_input(
        "Filter by config",
        key="config_filter",
        placeholder="e.g. optim.lr=3e-4 model!=gpt2",
        help=CONFIG_FILTER_HELP,
        max_chars=FILTER_MAX_CHARS,
    )
    to_url("filter", name, default="")
    to_url("config", config, default="")


def column_controls(table: pd.DataFrame) -> None:
    """The runs page's choice of columns, into session state (``runs_page_view`` reads it): config
    keys picked by hand (options keep the chosen keys, so a key whose run vanished does not make the
    widget fail), the keys swept between the listed runs (on by default), and a metric whose last
    and best value each run shows; best is the least value unless the metric reads higher-is-better
    (accuracy, F1, reward…: ``sweep.best_is_max``), or as chosen; and the order of the runs
    (``views.runs_table.SORTS``).  Each is in the URL
    (``?column=a&column=b&swept=0&metric=val_loss&best=max&sort=best``); a metric or key named there that
    no run logs (yet: the runs may still be read) is kept, as the widgets keep a chosen one."""
    state = st.session_state
    url_texts("column", "config_columns")
    url_flag("swept", "swept_columns", default=True)
    url_text("metric", "runs_metric", default=None)
    url_choice("best", "runs_best", ("min", "max"), default=None)
    keys = config_keys([*table["config"].dropna(), dict.fromkeys(state.get("config_columns", []))])
    picker, swept = st.columns([4, 1], vertical_alignment="bottom")
    columns = picker.multiselect(
        "Config columns", keys, key="config_columns", placeholder="Show config keys as columns"
    )
    swept_on = swept.toggle(
        "Swept keys",
        key="swept_columns",
        help="Show the config keys whose values differ between the listed runs (a sweep's hyperparameters) as columns",
    )
    metrics = metric_keys(table["metrics"])
    url_choice("sort", "runs_sort", list(SORTS), default="activity")
    which, rule, order = st.columns([3, 1, 1], vertical_alignment="bottom")
    metric = which.selectbox(
        "Metric: last and best value",
        [*metrics, *{state.get("runs_metric")} - {None, *metrics}],
        index=None,
        key="runs_metric",
        format_func=shorten,
        placeholder="Show a metric's last and best value",
    )
    best = best_control(rule, "runs_best", metric)
    sorts = [*SORTS] if metric else ["activity", "name"]
    if state["runs_sort"] not in sorts:
        state["runs_sort"] = "activity"
    sort = order.selectbox("Sort by", sorts, format_func=SORTS.get, key="runs_sort", help=SORT_HELP)
    to_url("column", columns)
    to_url("swept", "1" if swept_on else "0", default="1")
    to_url("metric", metric)
    to_url("sort", sort, default="activity")
    to_url("best", best if st.session_state["runs_best_picked"] else None)


def best_control(where: Any, key: str, metric: str | None) -> str | None:
    """The "Best is" buttons for ``metric``, drawn in ``where`` (a column): the choice its name implies
    (``sweep.best_is_max``) shows selected until the user picks (a value already in ``key``, from
    the URL, counts as picked); picking the selected one again goes back to the name's choice.
    Returns "min", "max", or None without a metric."""
    state, picked = st.session_state, f"{key}_picked"
    if picked not in state:
        state[picked] = state.get(key) is not None
    if not state[picked] or state.get(key) is None:
        state[key] = None if metric is None else "max" if best_is_max(metric) else "min"
        state[picked] = False
    where.segmented_control(
        "Best is", ("min", "max"), key=key, help=BEST_RULE, on_change=lambda: state.__setitem__(picked, True)
    )
    return state[key]


def selection_links(names: list[str], *, metric: str | None = None, value: str = "last", sweep: bool = True) -> None:
    """Links that open runs together: one run's page, the compare page of several, the sweep page of
    them (``sweep``; with the chosen ``metric``); nothing for no run."""
    if not names:
        return
    first, second, _ = st.columns([1, 1, 2])
    if len(names) == 1:
        first.page_link(
            "pages/run.py", label="Open the run", icon=":material/monitoring:", query_params={"run": names[0]}
        )
    else:
        first.page_link(
            "pages/compare.py",
            label=f"Compare {len(names)} runs",
            icon=":material/compare_arrows:",
            query_params={"run": names},
        )
    if sweep:
        extra = {"metric": metric, "value": value} if metric else {}
        second.page_link(
            "pages/sweep.py",
            label=f"Sweep of {len(names)} runs",
            icon=":material/scatter_plot:",
            query_params={"run": names, **extra},
        )


def linked_runs(table: pd.DataFrame, *, key: str) -> None:
    """``table`` (its ``run`` column names runs) drawn with each run a link that opens in this tab
    (one such table per page: it mounts ``SAME_TAB_JS`` under its one key)."""
    with st.container(key=SAME_TAB_KEY):
        st.html(SAME_TAB_JS, unsafe_allow_javascript=True)
    st.dataframe(
        run_links(table), hide_index=True, width="stretch", key=key, column_config={"run": RUNS_COLUMNS["run"]}
    )


MAX_LINKED_RUNS = 200  # runs named in a link to the sweep page of every listed run: a URL stays short


def runs_table_view(shown: RunsPage, drawn: RunsPage | None) -> None:
    """The runs table, one page of ``PAGE_ROWS`` at a time (newest activity first), with a page
    picker when there is more than one page; a click on a run's link (``SAME_TAB_JS``) opens that
    run in this tab; ticked rows open together (``selection_links``), else the listed runs' sweep.
    ``drawn``: the page drawn before, which a tick's row numbers refer to (this run's rows may have
    moved since the click)."""
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
        selection_mode="multi-row",
        column_config=RUNS_COLUMNS,
    )
    names = (drawn or shown).names
    ticked = [names[row] for row in picked.selection.rows if row < len(names)]
    metric = st.session_state.get("runs_metric")
    if ticked:
        selection_links(ticked, metric=metric)
    elif len(shown.listed) > 1:
        sweep_of_listed(shown.listed, metric)


def sweep_of_listed(listed: tuple[str, ...], metric: str | None) -> None:
    """A link to the sweep page of every listed run: named in the URL, or, beyond
    ``MAX_LINKED_RUNS`` with no filter set, the page's default (every run of the root)."""
    state = st.session_state
    named = len(listed) <= MAX_LINKED_RUNS
    if not named and (state.get("run_filter") or state.get("config_filter")):
        return  # too many to name, and not every run: filter further, or tick rows
    params = ({"run": list(listed)} if named else {}) | ({"metric": metric} if metric else {})
    st.page_link(
        "pages/sweep.py",
        label=f"Sweep of the {len(listed):,} listed runs",
        icon=":material/scatter_plot:",
        query_params=params,
    )
