"""`/sessions?run=<name>` — the sessions of one resumed run side by side: what each crash cost.
Opened from the top bar with no run named, it offers a picker of the runs.  Its alignment and
smoothing are in the URL too (`align=tokens_seen`, `smoothing=0.5`)."""

import streamlit as st

from metrics_core.analysis.derived import session_table
from metrics_core.dashboard.controls.url_state import smoothing_slider, to_url, url_choice
from metrics_core.dashboard.display_text import clock_text, file_stem, md_text, shorten
from metrics_core.dashboard.figures.chart_memo import view_session_overlay
from metrics_core.dashboard.live.chart_component import live_chart, load_plotly
from metrics_core.dashboard.panels import finding_text, sessions_table, stopped_panel
from metrics_core.dashboard.server.page_head import plotly_url
from metrics_core.dashboard.settings import get_store, settings
from metrics_core.dashboard.views.chart_specs import DEFAULT_CHARTS, charts_of
from metrics_core.dashboard.views.memo import view_findings
from metrics_core.dashboard.widgets import csv_button, live_view, page_theme, run_or_pick
from metrics_core.text import MISSING

ALIGNS = ["step", "tokens_seen"]
config = settings()
store = get_store(config)
load_plotly(plotly_url())  # first: the browser fetches and compiles plotly.js while the rest arrives
name = run_or_pick(store, refresh=config.refresh, title="Sessions of {}").name  # as resolved: "a/./b" is "a/b"
st.title(f"Sessions of {md_text(shorten(name))}")
st.page_link("pages/run.py", label="Back to the run's charts", icon=":material/arrow_back:", query_params={"run": name})
url_choice("align", "align", ALIGNS, default="step")
x = st.segmented_control("Align on", ALIGNS, key="align") or "step"
to_url("align", x, default="step")
smoothing = smoothing_slider(default=0.0)  # each session's own noise: unsmoothed by default


@st.fragment(run_every=config.refresh)
def sessions() -> None:
    view = live_view(store, name)
    if view is None:
        return
    theme = page_theme()  # here: the browser reports its theme with each rerun, not always the first
    stopped_panel(view)  # why the run stopped, as above its charts (each session's reason is in the table)
    train = view.frame("train", ("session_id", "skipped_updates_in_window"))  # what session_table reads
    lost = view.lost_work
    share = MISSING if lost.superseded_share is None else f"{lost.superseded_share:.1%}"
    for column, (label, value) in zip(
        st.columns(4),
        [
            ("Total downtime", clock_text(lost.downtime_s)),
            ("Steps replayed", f"{lost.steps_replayed:,}"),
            ("Tokens replayed", f"{'≤ ' if lost.tokens_replayed_is_upper_bound else ''}{lost.tokens_replayed:,}"),
            ("Training time superseded", share),
        ],
        strict=True,
    ):
        column.metric(label, value)
    table = session_table(view.sessions, train, view.status)
    sessions_table(table)
    csv_button(
        "CSV of the sessions table",
        lambda: table.to_csv(index=False),
        f"{file_stem(name)}-sessions.csv",
        key="csv_sessions",
    )
    for finding in view_findings(view):
        if finding.check in ("tokens per step at resume", "loss jump at resume"):
            st.warning(finding_text(finding), icon=":material/warning:")
    charts = {chart.key: chart for chart in charts_of(view)}
    key = st.selectbox("Chart", list(charts), format_func=lambda key: charts[key].title, key="session_chart")
    chart = charts.get(key, DEFAULT_CHARTS[0])
    overlay = view_session_overlay(view, chart=chart, x=x, smoothing=smoothing, theme=theme)
    live_chart(overlay, key="chart_sessions")
    st.caption(
        "Shaded: each replay, from the resume step to the last step the earlier session had reached. "
        "Δloss: the redo's mean train loss minus the earlier session's, over the same steps."
    )


sessions()
