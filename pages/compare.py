"""`/compare?run=<a>&run=<b>…` — several metrics of several runs, one colour per run (or per group
of runs: `group=<config key>`, `band=std`), and the config keys that differ between them; controls
in the sidebar (`controls.compare`), each in the URL: a link reopens the same view."""

import pandas as pd
import streamlit as st

from metrics_core.dashboard.controls.compare import compare_controls
from metrics_core.dashboard.controls.url_state import to_url, url_text
from metrics_core.dashboard.display_text import md_text, shorten
from metrics_core.dashboard.figures.run_charts import compare_chart
from metrics_core.dashboard.live.chart_component import live_chart, load_plotly
from metrics_core.dashboard.panels import config_diff_panel
from metrics_core.dashboard.server.page_head import plotly_url
from metrics_core.dashboard.settings import get_store, settings
from metrics_core.dashboard.views.chart_filter import FILTER_MAX_CHARS, RUN_FILTER_HELP
from metrics_core.dashboard.views.config_tables import view_config
from metrics_core.dashboard.views.runs_table import filter_runs
from metrics_core.dashboard.widgets import name_text, page_theme, run_names_or_stop, views_or_warn

config = settings()
store = get_store(config)
load_plotly(plotly_url())  # first: the browser fetches and compiles plotly.js while the rest arrives
st.title("Compare runs")
names = run_names_or_stop(store)
asked = st.query_params.get_all("run")
unknown = [name for name in asked if name not in names]
if unknown:
    st.warning(
        f"Not runs under the root, ignored: {', '.join(map(name_text, unknown[:5]))}"
        + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
    )
with st.sidebar:
    url_text("filter", "compare_filter", max_chars=FILTER_MAX_CHARS)
    pattern = st.text_input("Filter runs", key="compare_filter", help=RUN_FILTER_HELP, max_chars=FILTER_MAX_CHARS)
    to_url("filter", pattern, default="")
    shown, error = filter_runs(pd.DataFrame({"run": names}), pattern)
    if error:
        st.error(md_text(error))
    picked = st.multiselect(
        "Runs",
        sorted(set(shown["run"]) | set(asked) - set(unknown)),
        format_func=shorten,
        default=[name for name in asked if name in names],
        key="compare_runs",
    )
    chosen = compare_controls(views_or_warn(store, picked))  # metrics, x, groups, band, smoothing, log y
st.query_params["run"] = picked


@st.fragment(run_every=config.refresh)
def chart() -> None:
    if not picked:
        st.info("Pick one or more runs to compare in the sidebar.")
        return
    views = views_or_warn(store, picked, progress=True)  # a run still being read: its progress
    theme = page_theme()  # here: the browser reports its theme with each rerun, not always the first
    columns = st.columns(2)
    for number, metric in enumerate(chosen.metrics):
        drawn = {"x": chosen.x, "groups": chosen.groups, "band": chosen.band, "theme": theme}
        figure = compare_chart(views, metric, smoothing=chosen.smoothing, log_y=chosen.log_y, **drawn)
        with columns[number % 2]:
            live_chart(figure, key=f"chart_compare_{metric}")
    config_diff_panel({name: config.values if (config := view_config(view)) else None for name, view in views.items()})


chart()
