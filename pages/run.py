"""`/run?run=<name>` — one run's charts, refreshed live, with session boundaries and health.
Opened from the top bar with no run named, it offers a picker of the runs."""

import streamlit as st

from metrics_core.dashboard.alerting import show_run_alerts
from metrics_core.dashboard.config import view_config
from metrics_core.dashboard.display_text import md_text, shorten
from metrics_core.dashboard.downloads import csv_file_name, csv_link
from metrics_core.dashboard.figures import X_MODES
from metrics_core.dashboard.live_chart import live_chart, load_plotly
from metrics_core.dashboard.live_push import live_watch
from metrics_core.dashboard.live_views import view_chart_groups, view_findings, zoom_chart
from metrics_core.dashboard.server_routes import routes_served
from metrics_core.dashboard.settings import get_alerter, get_store, settings
from metrics_core.dashboard.store import RunView
from metrics_core.dashboard.views import (
    HISTORY_MODES,
    MAX_LOGGED_CHARTS,
    ChartOptions,
    chart_csv_of,
    chart_filter_error,
    chart_key,
)
from metrics_core.dashboard.widgets import (
    PANELS_KEY,
    config_panel,
    csv_button,
    health_panel,
    live_view,
    page_theme,
    refresh_slot,
    run_or_pick,
    session_key_panel,
    stopped_panel,
)

config = settings()
store = get_store(config)
alerter = get_alerter(config)
load_plotly()  # first: the browser fetches and compiles plotly.js while the rest arrives
name = run_or_pick(store, refresh=config.refresh).name  # as resolved: "a/./b" is "a/b"
st.title(md_text(shorten(name)), wrap=False)  # one line: the charts' place does not depend on the name
sessions_link, compare_link, _ = st.columns([1, 2, 3])
sessions_link.page_link("pages/sessions.py", label="Its sessions", icon=":material/restart_alt:",
                        query_params={"run": name})  # fmt: skip
compare_link.page_link("pages/compare.py", label="Compare with other runs", icon=":material/compare_arrows:",
                       query_params={"run": name})  # fmt: skip
with st.sidebar:
    x = st.selectbox("x axis", list(X_MODES), format_func=X_MODES.get, key="x_axis")
    smoothing = st.slider("Smoothing", 0.0, 0.99, 0.6, 0.01, key="smoothing")
    log_y = st.toggle("Log-scale y (loss, grad norm, LR)", key="log_y")
    history = st.radio("Sessions", list(HISTORY_MODES), key="history", format_func=HISTORY_MODES.get)
    paused = st.toggle("Pause live updates", key="pause")
    only = st.text_input("Charts (regular expression)", key="filter_charts", placeholder="e.g. loss|val/",
                         help="Charts whose title or key matches; the others are not drawn.")  # fmt: skip
    if error := chart_filter_error(only):
        st.error(md_text(error))
        only = ""


pushed = routes_served()  # the server says when the run changed: no rerun per refresh period


@st.fragment(run_every=None if paused or pushed else config.refresh)
def charts() -> None:
    view = live_view(store, name)  # outside the slot: it may wait for the run's reader
    if view is not None:
        with refresh_slot():
            draw_charts(view)
    if pushed and not paused:
        live_watch(name, view, refresh=config.refresh)


def draw_charts(view: RunView) -> None:
    # The theme is read here: the browser reports it with each rerun, not always the first.
    options = ChartOptions(x=x, smoothing=smoothing, log_y=log_y, history=history, theme=page_theme(), only=only)
    # Above the charts: the status row; why the run stopped and its firing alerts, only when there
    # is one; the health and config buttons; the session key.  Details open on demand.
    status = (f"**{view.status}** · {len(view.sessions)} session(s) · {view.records} records · "
              f"{view.ingest.bad_lines} bad lines · {view.ingest.pending_bytes} bytes pending")  # fmt: skip
    st.caption(status, wrap=False)
    stopped_panel(view)
    show_run_alerts(alerter, name)  # a line per alert firing for the run, only when one is
    with st.container(horizontal=True, wrap=False, vertical_alignment="center", key=PANELS_KEY):
        health_panel(view_findings(view))
        config_panel(view_config(view))
    session_key_panel(view)
    # once per snapshot, options and theme, shared by tabs
    groups, logged = view_chart_groups(view, options)
    for group, figures in groups.items():
        if group:
            st.subheader(md_text(group), divider="gray")
        left, right = st.columns(2)
        for number, (key, figure) in enumerate(figures.items()):
            with left if number % 2 == 0 else right:
                zoom = lambda xrange, key=key: zoom_chart(view, options, key, xrange)  # noqa: E731
                link = csv_link(name, key, options)  # a link in the chart: no widget per refresh
                live_chart(figure, key=chart_key(key), zoom=zoom, csv=link)  # a zoom shows that x-range's raw records
                if link is None:
                    rows = lambda key=key: chart_csv_of(view, options, key)  # noqa: E731 - built on click
                    csv_button("CSV of this chart", rows, csv_file_name(name, key), key=f"csv_{key}")
    if logged > MAX_LOGGED_CHARTS:
        st.caption(f"Showing the charts of {MAX_LOGGED_CHARTS} of the {logged} logged keys that match: "
                   "narrow the chart filter in the sidebar to see the others.")  # fmt: skip


charts()
