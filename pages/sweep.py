"""`/sweep?run=<a>&run=<b>…&metric=<key>&value=last|best` — a sweep at a glance: every config key
that differs between the runs (constant keys left out) against the metric's last or best value, a
chart per key and a point per run; zooming one chart to a range of its key (drag across it) keeps
the runs in that range, listed below and coloured in every chart.  With no ``run=``, every run of
the root.  Every control is in the URL (``best=min|max``, ``range=<key>:<low>:<high>``).  The page
is redrawn only when what it draws changed (``watch_sweep``), so a sweep standing still costs its
tab one O(runs) look per refresh and no bytes."""

import streamlit as st

from metrics_core.dashboard.figures.sweep_figures import chart_key, sweep_chart
from metrics_core.dashboard.live.chart_component import chart_zooms, live_chart, load_plotly
from metrics_core.dashboard.runs_table_view import best_control, linked_runs, selection_links
from metrics_core.dashboard.server.page_head import plotly_url
from metrics_core.dashboard.settings import get_store, settings
from metrics_core.dashboard.views.sweep import (
    VALUES,
    chosen_ranges,
    metric_keys,
    parse_range,
    sweep_inputs,
    sweep_of,
    sweep_query,
    sweep_table,
)
from metrics_core.dashboard.widgets import name_text, page_theme, runs_table_or_stop

config = settings()
store = get_store(config)
load_plotly(plotly_url())  # first: the browser fetches and compiles plotly.js while the rest arrives
st.title("Sweep")
asked = st.query_params.get_all("run")
url_ranges = dict(found for text in st.query_params.get_all("range") if (found := parse_range(text)))
state = st.session_state
for name, wanted, allowed in (
    ("sweep_metric", "metric", None),
    ("sweep_value", "value", VALUES),
    ("sweep_best", "best", ("min", "max")),
):
    if name not in state and st.query_params.get(wanted) and (allowed is None or st.query_params[wanted] in allowed):
        state[name] = st.query_params[wanted]  # the metric is checked against the runs' below


def sweep_view() -> None:
    table = runs_table_or_stop(store)
    unknown = [name for name in asked if name not in set(table["run"])]
    if unknown:
        st.warning(f"Not runs under the root, ignored: {', '.join(map(name_text, unknown[:5]))}")
    configs, tails = state["sweep_drawn"] = sweep_inputs(table, asked)
    metrics = metric_keys(tails.values())
    if not metrics:
        st.info("None of these runs has logged a number yet.")
        return
    if state.get("sweep_metric") not in metrics:
        state["sweep_metric"] = metrics[0]
    controls = st.columns([3, 1, 1], vertical_alignment="bottom")
    metric = controls[0].selectbox("Metric", metrics, key="sweep_metric")
    state["sweep_value"] = state.get("sweep_value") or "last"  # the value in force shows selected
    value = controls[1].segmented_control("Value", VALUES, key="sweep_value")
    best = best_control(controls[2], "sweep_best", metric)
    sweep = sweep_of(configs, tails, metric=metric, value=value, best_max=best == "max")
    if not sweep.axes:
        st.info("These runs share every config key: there is no sweep to show.")
        return
    ranges = chosen_ranges(sweep, chart_zooms(), url_ranges, chart_key)
    chosen = sweep.chosen(ranges)
    theme = page_theme()
    columns = st.columns(2)
    for number, axis in enumerate(sweep.axes):
        with columns[number % 2]:
            live_chart(sweep_chart(sweep, axis, chosen, xrange=ranges.get(axis.key), theme=theme), key=chart_key(axis))
    if sweep.uncharted:
        st.caption(f"{sweep.uncharted} more swept keys are not charted; the runs page's config filter narrows the runs")
    picked = [run for run, keep in zip(sweep.runs, chosen, strict=True) if keep]
    st.caption(
        f"{len(picked)} of {len(sweep.runs)} runs in the ranges chosen (zoom a chart to choose; double click resets)"
    )
    selection_links(picked, metric=metric, value=value, sweep=False)
    linked_runs(sweep_table(sweep, configs, chosen), key="sweep_runs")
    query = sweep_query(asked, sweep, ranges)
    if {name: st.query_params.get_all(name) for name in query} != query:
        st.query_params.from_dict(query)


@st.fragment(run_every=config.refresh)
def watch_sweep() -> None:
    """Redraw the page when what it draws changed (a run read, a value logged): O(runs) per refresh,
    nothing sent while the sweep stands still."""
    if sweep_inputs(runs_table_or_stop(store), asked) != state.get("sweep_drawn"):
        st.rerun()


sweep_view()
watch_sweep()
