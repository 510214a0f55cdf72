"""`/` — every run under the root, newest activity first: status, progress, losses with a trend,
health, the config keys swept between the listed runs and any chosen, a chosen metric's last and
best value.  A click on a run opens it in this tab; ticked rows open together (one: its run;
several: the compare page), and the sweep page shows the ticked runs, or every one listed.

Every column comes from ``RunStore.runs_table()`` (O(runs), from per-run summaries); no run is
snapshotted here.  The table is drawn by the page, not by the live fragment: the fragment only
looks for a change and reruns the page when the page it would draw differs from the one drawn
(``runs_table_view.RunsPage``), so a table that did not change is never redrawn (a click on a row is not
lost to a redraw, the view does not flicker).  Looking costs O(1) when nothing happened: the
store's ``runs_table_generation()`` did not move and no age shown ("18 s ago") is due to read
differently; else one page is built and compared (~a few ms for 1,000 runs).  So while the store's
loader reads a cold root, or runs off this page append, the page stays as it is unless a row it
shows changed.  A root of more than ``PAGE_ROWS`` runs is shown a page at a time (newest activity
first, so live runs lead the first page): a live update formats and sends one page, not the
whole root.  Above the table, the alerts of the server's one alerter: the fragment reruns the
page when they read differently.  Below it, a read-only SQL query over every run (``sql_box.query_box``).
"""

import time
from pathlib import Path

import streamlit as st

from metrics_core.dashboard.alerting import notice_of, show_notice
from metrics_core.dashboard.display_text import md_text
from metrics_core.dashboard.runs_table_view import column_controls, filter_controls, runs_page_view, runs_table_view
from metrics_core.dashboard.settings import ask_for_demo, get_alerter, get_store, settings
from metrics_core.dashboard.sql_box import query_box
from metrics_core.dashboard.widgets import demo_note, runs_table_or_stop

config = settings()
store = get_store(config)
st.title("Runs")
where = config.runs.resolve() if isinstance(config.runs, Path) else config.runs  # a bucket: s3://bucket/prefix
st.caption(md_text(f"Watching {where} ({store.source.mode}: {store.source.mode_reason})"))
if config.demo_of is not None:
    demo_note(config.runs, config.demo_of)
alerter = get_alerter(config)
notice = show_notice(notice_of(alerter))
generation = store.runs_table_generation()  # read first: a change during runs page() is looked at, never unseen
drawn = st.session_state.get("runs_shown", (None, None))[1]  # the page drawn before: a tick refers to its rows
# Until this run draws a table: a run that stops before it (no runs yet, or the root cannot be
# listed) must be redrawn as soon as there is a table, whether or not the store changed since.
st.session_state["runs_shown"] = (None, None)
table = runs_table_or_stop(store)


@st.fragment(run_every=config.refresh)
def watch_runs() -> None:
    if st.session_state.pop("runs_just_read", False):
        return  # called inline by the page run that just read the table
    if notice_of(alerter) != notice or (config.demo_of is not None and settings().demo_of is None):
        st.rerun()  # new alerts, or the user's first run ends the demo
    seen = store.runs_table_generation()
    latest = runs_table_or_stop(store)  # brings the rows up to date (a stat per run when due)
    shown_generation, drawn = st.session_state.get("runs_shown", (None, None))
    if drawn is None:  # the page drew no table (no runs yet, or they could not be listed)
        if not latest.empty:
            st.rerun()  # there is one now
        return
    if seen == shown_generation and time.time() < drawn.ages_change_at:
        return  # nothing happened that the page could show
    now_shown = runs_page_view(latest)
    if not now_shown.same_as(drawn):
        st.rerun()
    st.session_state["runs_shown"] = (seen, now_shown)


st.session_state["runs_just_read"] = True
watch_runs()
if table.empty and config.demo_of is not None:
    st.info("The demo's runs appear here in a few seconds.")
    st.stop()
if table.empty:
    st.info(f"No runs under {md_text(config.runs)} yet: a run is any directory holding a metrics.jsonl.")
    if isinstance(config.runs, Path) and st.button("Show a live demo meanwhile", key="start_demo"):
        ask_for_demo()
        st.rerun()
    st.stop()
filter_controls()
column_controls(table)
shown = runs_page_view(table)  # what the filters above select, from their session state
st.session_state["runs_shown"] = (generation, shown)
runs_table_view(shown, drawn)
query_box(config.runs, config.cache)
