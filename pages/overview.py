"""`/` — every run under the root, newest activity first: status, progress, losses with a trend,
health, chosen config keys.  A click on a row opens the run in this tab.

The table is drawn by the page, not by the live fragment: the fragment only looks for a change
and reruns the page when there is one, so a table that did not change is never redrawn (a click
on a row is not lost to a refresh, the view does not flicker).
"""

import streamlit as st

from metrics_core.dashboard.config import config_keys, runs_table
from metrics_core.dashboard.overview import filter_runs, md_text, readable_runs, run_links, status_colour
from metrics_core.dashboard.settings import get_demo, get_store, settings
from metrics_core.dashboard.widgets import RUNS_COLUMNS, overview_or_stop, overview_with_trends, runs_signature

config = settings()
store = get_store(config)
st.title("Runs")
st.caption(md_text(f"Watching {config.runs.resolve()} ({store.watcher.mode}: {store.watcher.mode_reason})"))
table = overview_with_trends(store, overview_or_stop(store))
st.session_state["runs_signature"] = runs_signature(table)


@st.fragment(run_every=config.refresh)
def watch_runs() -> None:
    if runs_signature(overview_with_trends(store, overview_or_stop(store))) != st.session_state.get("runs_signature"):
        st.rerun()


watch_runs()
if table.empty:
    st.info(f"No runs under {md_text(config.runs)} yet: a run is any directory holding a metrics.jsonl.")
    if st.button("Start the live demo run", key="start_demo"):
        get_demo(config.runs.resolve())
        st.rerun()
    st.stop()
by_name, by_config = st.columns(2)
pattern = by_name.text_input("Filter runs (regular expression)", key="run_filter", placeholder="e.g. ^llama.*lr3e-4")
config_filter = by_config.text_input(
    "Filter by config", key="config_filter", placeholder="e.g. optim.lr=3e-4 model!=gpt2",
    help="Space-separated `key=value` or `key!=value` terms on the flattened config (`optim.lr`), all must "
    "hold; numbers compare as numbers (`3e-4` matches `0.0003`); quote a term holding a space.",
)  # fmt: skip
# Options keep the chosen keys, so a key whose run vanished does not make the widget fail.
keys = config_keys([*table["config"].dropna(), dict.fromkeys(st.session_state.get("config_columns", []))])
chosen = st.multiselect("Config columns", keys, key="config_columns", placeholder="Show config keys as columns")
shown, error = filter_runs(table, pattern)
if error:
    st.error(md_text(error))
shown, error = runs_table(shown, keys=chosen, config_filter=config_filter)
if error:
    st.error(md_text(error))
shown = readable_runs(shown)
styled = run_links(shown).style.map(status_colour, subset=["status"])
picked = st.dataframe(
    styled, hide_index=True, width="stretch", key="runs_table", on_select="rerun",
    selection_mode="single-row", column_config=RUNS_COLUMNS,
)  # fmt: skip
if picked.selection.rows:
    st.switch_page("pages/run.py", query_params={"run": shown["run"].iloc[picked.selection.rows[0]]})
