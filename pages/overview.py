"""`/` — every run under the root, live: status, progress, last losses, health, chosen config keys."""

import streamlit as st

from metrics_core.dashboard.config import config_keys, runs_table
from metrics_core.dashboard.overview import filter_runs, md_text, run_links
from metrics_core.dashboard.settings import get_demo, get_store, settings
from metrics_core.dashboard.widgets import overview_or_stop

config = settings()
store = get_store(config)
st.title("Runs")
st.caption(md_text(f"Watching {config.runs.resolve()} ({store.watcher.mode}: {store.watcher.mode_reason})"))
by_name, by_config = st.columns(2)
pattern = by_name.text_input("Filter runs (regular expression)", key="run_filter", placeholder="e.g. ^llama.*lr3e-4")
config_filter = by_config.text_input(
    "Filter by config", key="config_filter", placeholder="e.g. optim.lr=3e-4 model!=gpt2"
)
st.caption("Config filter: space-separated `key=value` or `key!=value` terms on the flattened config (`optim.lr`), "
           "all must hold; numbers compare as numbers (`3e-4` matches `0.0003`); quote a term holding a space. "
           "Pick config keys below to show them as columns.")  # fmt: skip


@st.fragment(run_every=config.refresh)
def runs_table_fragment() -> None:
    table = overview_or_stop(store)
    if table.empty:
        st.info(f"No runs under {md_text(config.runs)} yet: a run is any directory holding a metrics.jsonl.")
        if st.button("Start the live demo run", key="start_demo"):
            get_demo(config.runs.resolve())
            st.rerun()
        return
    # Options keep the chosen keys, so a key whose run vanished does not make the widget fail.
    keys = config_keys([*table["config"].dropna(), dict.fromkeys(st.session_state.get("config_columns", []))])
    chosen = st.multiselect("Config columns", keys, key="config_columns", placeholder="Show config keys as columns")
    shown, error = filter_runs(table, pattern)
    if error:
        st.error(md_text(error))
    shown, error = runs_table(shown, keys=chosen, config_filter=config_filter)
    if error:
        st.error(md_text(error))
    st.dataframe(
        run_links(shown), hide_index=True, width="stretch",
        column_config={"run": st.column_config.LinkColumn("run", display_text=r"run=(.*)$")},
    )  # fmt: skip


runs_table_fragment()
