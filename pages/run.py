"""`/run?run=<name>` — one run's charts, refreshed live, with session boundaries and health.
Opened from the top bar with no run named, it offers a picker of the runs."""

from dataclasses import replace

import streamlit as st

from metrics_core.dashboard.alerting import run_alerts, show_run_alerts
from metrics_core.dashboard.chart_grid import chart_controls, chart_grid, run_panels, status_caption
from metrics_core.dashboard.display_text import md_text, shorten
from metrics_core.dashboard.live.chart_component import load_plotly
from metrics_core.dashboard.live.push import live_watch, watched_hold
from metrics_core.dashboard.panels import stopped_panel
from metrics_core.dashboard.server.page_head import plotly_url
from metrics_core.dashboard.server.serving import routes_served
from metrics_core.dashboard.settings import get_alerter, get_store, settings
from metrics_core.dashboard.store.run_store import RunView
from metrics_core.dashboard.widgets import live_view, page_theme, refresh_slot, run_or_pick

config = settings()
store = get_store(config)
alerter = get_alerter(config)
load_plotly(plotly_url())  # first: the browser fetches and compiles plotly.js while the rest arrives
opened = run_or_pick(store, refresh=config.refresh)
name = opened.name  # as resolved: "a/./b" is "a/b"
st.title(md_text(shorten(name)), wrap=False)  # one line: the charts' place does not depend on the name
sessions_link, compare_link, _ = st.columns([1, 2, 3])
sessions_link.page_link(
    "pages/sessions.py", label="Its sessions", icon=":material/restart_alt:", query_params={"run": name}
)
compare_link.page_link(
    "pages/compare.py", label="Compare with other runs", icon=":material/compare_arrows:", query_params={"run": name}
)
options, paused = chart_controls(opened)  # the x axis offers the keys the run logs that grow


pushed = routes_served() and not paused  # the server says when the run changed, and what: no rerun per period


@st.fragment(run_every=None if paused or pushed else config.refresh)
def charts() -> None:
    if pushed:
        watched_hold()
    view = live_view(store, name)  # outside the slot: it may wait for the run's reader
    if view is not None:
        with refresh_slot():
            draw_charts(view)
    elif pushed:
        live_watch(name, None, refresh=config.refresh, options=options)


def draw_charts(view: RunView) -> None:
    # Above the charts: the status line, why the run stopped and its firing alerts (only when there
    # are), the health and config buttons, the session key.  Details open on demand.  Drawn after
    # the charts, which a big run's page shows one by one as they are built, without waiting for
    # its health checks.  The theme is read here: the browser reports it with each rerun, not always the first.
    drawn, alerts = replace(options, theme=page_theme()), run_alerts(alerter, name)
    above = st.container()
    chart_grid(view, drawn)
    with above:
        if pushed:  # the status line, kept current with the charts by the server's answers
            live_watch(name, view, refresh=config.refresh, options=drawn, alerts=alerts)
        else:
            status_caption(view)
        stopped_panel(view)
        show_run_alerts(alerts)
        run_panels(view)


charts()
