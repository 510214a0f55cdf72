"""`/sessions?run=<name>` — the sessions of one resumed run side by side: what each crash cost."""

import streamlit as st

from metrics_core.analysis import lost_work, session_table
from metrics_core.dashboard.chart import live_chart, load_plotly
from metrics_core.dashboard.charts import session_overlay, view_findings
from metrics_core.dashboard.overview import file_stem, md_text, run_link, shorten
from metrics_core.dashboard.settings import get_store, settings
from metrics_core.dashboard.widgets import csv_button, finding_text, live_view, table_text, view_or_stop

config = settings()
store = get_store(config)
name = st.query_params.get("run", "")
name = view_or_stop(store, name, refresh=config.refresh).name  # as resolved: "a/./b" is "a/b"
st.title(f"Sessions of {md_text(shorten(name))}")
st.markdown(f"[Back to the run's charts]({run_link(name)})")
x = st.segmented_control("Align on", ["step", "tokens_seen"], default="step", key="align") or "step"
smoothing = st.slider("Smoothing", 0.0, 0.99, 0.0, 0.01, key="smoothing")
load_plotly()


@st.fragment(run_every=config.refresh)
def sessions() -> None:
    view = live_view(store, name)
    if view is None:
        return
    train = view.frames["train"]
    lost = lost_work(view.sessions, train, view.superseded["train"])
    share = "–" if lost.superseded_share is None else f"{lost.superseded_share:.1%}"
    for column, (label, value) in zip(st.columns(4), [
        ("Total downtime", f"{lost.downtime_s:,.0f} s"), ("Steps replayed", f"{lost.steps_replayed:,}"),
        ("Tokens replayed", f"{lost.tokens_replayed:,}"), ("Training time superseded", share),
    ], strict=True):  # fmt: skip
        column.metric(label, value)
    table = session_table(view.sessions, train, view.status)
    st.table(table_text(table.set_index("session")))
    csv_button("CSV of the sessions table", lambda: table.to_csv(index=False), f"{file_stem(name)}-sessions.csv",
               key="csv_sessions")  # fmt: skip
    for finding in view_findings(view):
        if finding.check in ("tokens per step at resume", "loss jump at resume"):
            st.warning(finding_text(finding), icon=":material/warning:")
    overlay = view.memo(("overlay", x, smoothing), lambda: session_overlay(view, x=x, smoothing=smoothing))
    live_chart(overlay, key="chart_sessions")


sessions()
