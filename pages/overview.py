"""`/` — every run under the root, newest activity first: status, progress, losses with a trend,
health, chosen config keys.  A click on a row opens the run in this tab.

Every column comes from ``RunStore.overview()`` (O(runs), from per-run summaries); no run is
snapshotted here.  The table is drawn by the page, not by the live fragment: the fragment only
looks for a change and reruns the page when there is one, so a table that did not change is
never redrawn (a click on a row is not lost to a refresh, the view does not flicker).  "A change"
is O(1) to tell: the store's ``overview_generation()`` moved, or an age shown ("18 s ago") is due
to read differently (``next_age_change``); a refresh that finds neither costs the store's
``overview()`` (~5 ms for 1,000 runs) and no table work.  While the store's loader reads a cold
root, rows change all the time: the table is then redrawn every ``LOADING_REDRAW_S``, not on
every refresh (each redraw of 1,000 rows is a table conversion on the server and a repaint).
A root of more than ``PAGE_ROWS`` runs is shown a page at a time (newest activity first, so live
runs lead the first page): a live update formats and sends one page, ~50 KB instead of ~0.5 MB.
"""

import time

import streamlit as st

from metrics_core.dashboard.config import config_keys, runs_table
from metrics_core.dashboard.overview import filter_runs, md_text, next_age_change
from metrics_core.dashboard.settings import get_demo, get_store, settings
from metrics_core.dashboard.widgets import overview_or_stop, runs_table_view

LOADING_REDRAW_S = 1.0  # while the store reads a cold root, the table is redrawn at most this often

config = settings()
store = get_store(config)
st.title("Runs")
st.caption(md_text(f"Watching {config.runs.resolve()} ({store.watcher.mode}: {store.watcher.mode_reason})"))
generation = store.overview_generation()  # read first: a change during overview() reruns, never goes unseen
table = overview_or_stop(store)
drawn_at = time.time()
loading = bool((table["status"] == "loading").any())
st.session_state["runs_shown"] = (
    generation,
    drawn_at + next_age_change(table["last record age (s)"]),
    drawn_at + (LOADING_REDRAW_S if loading else 0.0),
)


@st.fragment(run_every=config.refresh)
def watch_runs() -> None:
    if st.session_state.pop("runs_just_read", False):
        return  # called inline by the page run that just read the table: another overview() here
        # would find rows read meanwhile (a cold root), see the generation move and rerun the page
        # before it ever drew its table
    overview_or_stop(store)  # brings the rows up to date (a stat per run when due), no table work
    shown_generation, ages_change_at, changes_shown_from = st.session_state.get("runs_shown", (None, 0.0, 0.0))
    now = time.time()
    if (store.overview_generation() != shown_generation and now >= changes_shown_from) or now >= ages_change_at:
        st.rerun()


st.session_state["runs_just_read"] = True
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
runs_table_view(shown)
