"""The run page's charts as Streamlit draws them: the sidebar controls that choose them
(``chart_controls``), the status line where no live watch shows it (``status_caption``), and the grid of live charts
under their group headings, each with its CSV (``chart_grid``).

What is drawn comes from ``figures.chart_memo`` (memoised per snapshot, shared by tabs); this module only
lays it out, so ``pages/run.py`` stays a page that reads widgets and shows what they return.
"""

from __future__ import annotations

import streamlit as st

from metrics_core.dashboard.controls.url_state import log_y_toggle, smoothing_slider, to_url, url_choice, url_text
from metrics_core.dashboard.display_text import md_text
from metrics_core.dashboard.downloads import csv_file_name, csv_link
from metrics_core.dashboard.figures.chart_memo import view_chart_grid, zoom_chart
from metrics_core.dashboard.live.chart_component import live_chart
from metrics_core.dashboard.live.feed import status_line
from metrics_core.dashboard.panels import PANELS_KEY, config_panel, health_panel, session_key_panel
from metrics_core.dashboard.store.run_store import RunView
from metrics_core.dashboard.views.chart_csv import chart_csv_pieces_of
from metrics_core.dashboard.views.chart_filter import FILTER_HELP, FILTER_MAX_CHARS, filter_error
from metrics_core.dashboard.views.chart_specs import HISTORY_MODES, MAX_LOGGED_CHARTS, ChartOptions, chart_key
from metrics_core.dashboard.views.config_tables import view_config
from metrics_core.dashboard.views.memo import view_findings, view_x_keys
from metrics_core.dashboard.views.x_keys import X_MODES, x_error
from metrics_core.dashboard.widgets import csv_button


def chart_controls(view: RunView) -> tuple[ChartOptions, bool]:
    """The sidebar's chart options for ``view``'s run (the theme is the fragment's to read: see
    ``page_theme``) and whether live updates are paused.  The x axis is a mode of ``X_MODES`` or a
    key the run logs that grows within each session (``view_x_keys``), and lives in the URL
    (``?x=epoch``); one that does not grow is refused with a message.  The chart filter is in the URL
    too (``?charts=loss|val/``); a refused one is said, and filters nothing; so are the smoothing and
    log-y (``?smoothing=0.8&log=1``, ``url_state``)."""
    keys = view_x_keys(view)
    choices = [*X_MODES, *keys]
    with st.sidebar:
        url_choice("x", "x_axis", choices, default="step", refusal=lambda asked: x_error(asked, keys))
        x = st.selectbox("x axis", choices, format_func=lambda x: X_MODES.get(x, x), key="x_axis")
        to_url("x", x, default="step")
        smoothing = smoothing_slider()
        log_y = log_y_toggle("Log-scale y (loss, grad norm, LR)")
        history = st.radio("Sessions", list(HISTORY_MODES), key="history", format_func=HISTORY_MODES.get)
        paused = st.toggle("Pause live updates", key="pause")
        url_text("charts", "filter_charts", max_chars=FILTER_MAX_CHARS)
        only = st.text_input(
            "Charts (filter)",
            key="filter_charts",
            max_chars=FILTER_MAX_CHARS,
            placeholder="e.g. loss|val/",
            help=f"{FILTER_HELP} The others are not drawn.",
        )
        to_url("charts", only, default="")
        if error := filter_error(only):
            st.error(md_text(error))
            only = ""
    return ChartOptions(x=x, smoothing=smoothing, log_y=log_y, history=history, only=only), paused


def status_caption(view: RunView) -> None:
    """The run's status and counts in one line (``feed.status_line``) where no live watch shows
    them (paused, or no server routes)."""
    status, counts = status_line(view)
    st.caption(f"**{status}**{counts}", wrap=False)


def run_panels(view: RunView) -> None:
    """The health and config buttons in one row, then the session key: details open on demand."""
    with st.container(horizontal=True, wrap=False, vertical_alignment="center", key=PANELS_KEY):
        health_panel(view_findings(view))
        config_panel(view_config(view))
    session_key_panel(view)


def chart_grid(view: RunView, options: ChartOptions) -> None:
    """Every chart ``options`` keeps, two a row under their group's heading, each with a CSV of
    exactly what it draws; a zoom draws that x-range's raw records (``zoom_chart``).  Says how many
    logged keys' charts the filter matched beyond ``MAX_LOGGED_CHARTS``."""
    grid = view_chart_grid(view, options)  # once per snapshot, options and theme, shared by tabs
    for group, keys in grid.groups.items():
        if group:
            st.subheader(md_text(group), divider="gray")
        left, right = st.columns(2)
        for number, key in enumerate(keys):
            with left if number % 2 == 0 else right:
                zoom = lambda xrange, key=key: zoom_chart(view, options, key, xrange)  # noqa: E731
                link = csv_link(view.name, key, options)  # a link in the chart: no widget per refresh
                live_chart(grid.figure(key), key=chart_key(key), zoom=zoom, csv=link)  # sent as soon as drawn
                if link is None:  # no server route here (plain serving, AppTest): a button
                    rows = lambda key=key: "".join(chart_csv_pieces_of(view, options, key))  # noqa: E731 - on click
                    csv_button("CSV of this chart", rows, csv_file_name(view.name, key), key=f"csv_{key}")
    if grid.logged > MAX_LOGGED_CHARTS:
        st.caption(
            f"Showing the charts of {MAX_LOGGED_CHARTS} of the {grid.logged} logged keys that match: "
            "narrow the chart filter in the sidebar to see the others."
        )
