"""`/` — every run under the root, live: status, progress, last losses, health."""

import streamlit as st

from metrics_core.dashboard.overview import filter_runs, md_text, run_links
from metrics_core.dashboard.settings import get_demo, get_store, settings
from metrics_core.dashboard.widgets import overview_or_stop

config = settings()
store = get_store(config)
st.title("Runs")
st.caption(md_text(f"Watching {config.runs.resolve()} ({store.watcher.mode}: {store.watcher.mode_reason})"))
pattern = st.text_input("Filter runs (regular expression)", key="run_filter", placeholder="e.g. ^llama.*lr3e-4")


@st.fragment(run_every=config.refresh)
def runs_table() -> None:
    table = overview_or_stop(store)
    if table.empty:
        st.info(f"No runs under {md_text(config.runs)} yet: a run is any directory holding a metrics.jsonl.")
        if st.button("Start the live demo run", key="start_demo"):
            get_demo(config.runs.resolve())
            st.rerun()
        return
    shown, error = filter_runs(table, pattern)
    if error:
        st.error(md_text(error))
    st.dataframe(
        run_links(shown), hide_index=True, width="stretch",
        column_config={"run": st.column_config.LinkColumn("run", display_text=r"run=(.*)$")},
    )  # fmt: skip


runs_table()
