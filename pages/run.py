"""`/run?run=<name>` — one run's charts, refreshed live, with session boundaries and health."""

import streamlit as st

from metrics_core.dashboard.chart import live_chart, load_plotly
from metrics_core.dashboard.charts import (
    HISTORY_MODES,
    ChartOptions,
    chart_csv,
    chart_specs,
    view_charts,
    view_findings,
)
from metrics_core.dashboard.config import view_config
from metrics_core.dashboard.figures import X_MODES
from metrics_core.dashboard.overview import file_stem, md_text, run_link, shorten
from metrics_core.dashboard.settings import get_store, settings
from metrics_core.dashboard.widgets import config_panel, csv_button, health_panel, live_view, view_or_stop

config = settings()
store = get_store(config)
name = st.query_params.get("run", "")
name = view_or_stop(store, name, refresh=config.refresh).name  # as resolved: "a/./b" is "a/b"

st.title(md_text(shorten(name)))
st.markdown(
    f"[Compare its sessions]({run_link(name, 'sessions')}) · [Compare with other runs]({run_link(name, 'compare')})"
)
with st.sidebar:
    x = st.selectbox("x axis", list(X_MODES), format_func=X_MODES.get, key="x_axis")
    smoothing = st.slider("Smoothing", 0.0, 0.99, 0.6, 0.01, key="smoothing")
    log_y = st.toggle("Log-scale y (loss, grad norm, LR)", key="log_y")
    history = st.radio("Sessions", list(HISTORY_MODES), key="history", format_func=HISTORY_MODES.get)
    paused = st.toggle("Pause live updates", key="pause")
options = ChartOptions(x=x, smoothing=smoothing, log_y=log_y, history=history)
load_plotly()


@st.fragment(run_every=None if paused else config.refresh)
def charts() -> None:
    view = live_view(store, name)
    if view is None:
        return
    st.caption(f"**{view.status}** · {len(view.sessions)} session(s) · {view.records} records · "
               f"{view.ingest.bad_lines} bad lines · {view.ingest.pending_bytes} bytes pending")  # fmt: skip
    health_panel(view_findings(view))
    config_panel(view_config(view))
    left, right = st.columns(2)
    for number, (key, figure) in enumerate(view_charts(view, options).items()):
        with left if number % 2 == 0 else right:
            live_chart(figure, key=f"chart_{key}")
            file_name = f"{file_stem(name)}-{key}.csv"
            rows = lambda key=key: chart_csv(chart_specs(view, options.history)[key])  # noqa: E731 - built on click
            csv_button("CSV of this chart", rows, file_name, key=f"csv_{key}")


charts()
