"""`/run?run=<name>` — one run's charts, refreshed live, with session boundaries."""

import streamlit as st

from metrics_core.dashboard.chart import live_chart, load_plotly
from metrics_core.dashboard.charts import ChartOptions, run_charts
from metrics_core.dashboard.figures import X_MODES
from metrics_core.dashboard.settings import get_store, settings
from metrics_core.errors import MetricsError

config = settings()
store = get_store(config.runs, config.poll)
name = st.query_params.get("run", "")
try:
    store.view(name)  # validates the name before any widget is drawn
except MetricsError as exc:
    st.error(f"Cannot show run {name!r}: {exc}")
    st.page_link("pages/overview.py", label="Back to all runs")
    st.stop()

st.title(name)
with st.sidebar:
    x = st.selectbox("x axis", list(X_MODES), format_func=X_MODES.get, key="x_axis")
    smoothing = st.slider("Smoothing", 0.0, 0.99, 0.6, 0.01, key="smoothing")
    log_y = st.toggle("Log-scale y (loss, grad norm, LR)", key="log_y")
    history = st.radio("Sessions", ["effective", "all"], key="history",
                       format_func={"effective": "effective history", "all": "all sessions"}.get)  # fmt: skip
    paused = st.toggle("Pause live updates", key="pause")
options = ChartOptions(x=x, smoothing=smoothing, log_y=log_y, history=history)
load_plotly()


@st.fragment(run_every=None if paused else config.refresh)
def charts() -> None:
    current = store.view(name)
    st.caption(
        f"**{current.status}** · {len(current.sessions)} session(s) · {current.records} records · "
        f"{current.bad_lines} bad lines · {current.pending_bytes} bytes pending"
    )
    left, right = st.columns(2)
    for number, (key, figure) in enumerate(run_charts(current, options).items()):
        with left if number % 2 == 0 else right:
            live_chart(figure, key=f"chart_{key}")


charts()
