"""The runs page's SQL box: one read-only DuckDB query over every run (``metrics_core.sql.query``),
its answer as a data grid with a CSV download.  Kept apart from ``widgets`` because it owns a
job of its own: a scratch export directory, the box's limits, an answer kept across reruns.

Bounded, since every viewer of the server shares it: one query at a time per server process (a
second one is told the server is busy, never queued), ``SQL_TIMEOUT_S`` over the whole request
(the export brought up to date, the query and its answer), at most ``SQL_MAX_ROWS`` rows and
``SQL_MAX_BYTES`` of answer, kept as Arrow in the session, DuckDB's spills in the server's
cache directory (``query.spill_directory``), and the query itself in a process of its own held to
``query_process.ENGINE_BYTES`` of memory, so no statement grows the server."""

from __future__ import annotations

import functools
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from metrics_core.dashboard.display_text import csv_frame
from metrics_core.dashboard.widgets import STORE_ERRORS, csv_button, reason_text

if TYPE_CHECKING:
    import pyarrow as pa

SQL_TIMEOUT_S = 10.0  # a query box request is stopped then, export included: the server is shared
SQL_MAX_ROWS = 10_000  # rows a query box shows and downloads; the command line has them all
SQL_MAX_BYTES = 16 << 20  # bytes of answer a query box keeps per session (as Arrow)
SQL_EXAMPLE = "SELECT run, status, sessions, last_step, min_train_loss FROM runs ORDER BY min_train_loss"
BUSY = "Another query is running on this server: run yours when it is done."


@functools.cache
def _sql_scratch() -> Path:
    """Where a server started with ``--no-cache`` keeps the export SQL reads: its own temporary
    directory, for its lifetime (never the runs root)."""
    return Path(tempfile.mkdtemp(prefix="metrics-sql-"))


@st.cache_resource(show_spinner=False)
def _one_query() -> threading.Lock:
    """Held while a query box query runs: one per server process, shared by every session."""
    return threading.Lock()


def query_box(root: Path, cache: Path | None) -> None:
    """A read-only SQL query over every run (``metrics_core.sql.query``), under the runs table.

    The statement is refused unless it only reads, and stopped after ``SQL_TIMEOUT_S``; while
    another session's query runs, the box says the server is busy.  The answer is kept in this
    session's state, so the page's live reruns keep showing it.  Rows are a data grid (text stays
    text) with a CSV download (a cell that starts like a formula kept text: ``csv_frame``); a
    refused or failed query is one escaped line of error, and the rest of the page is untouched.
    """
    from metrics_core.sql.query_process import query_root
    from metrics_core.sql.query_views import VIEWS

    st.subheader("SQL over every run")
    views = ", ".join(f"`{name}`" for name in VIEWS)
    st.caption(
        f"One read-only DuckDB query over the views {views} (`python -m metrics_core query --help` lists their "
        f"columns); stopped after {SQL_TIMEOUT_S:g} s, the first {SQL_MAX_ROWS:,} rows and "
        f"{SQL_MAX_BYTES >> 20} MB shown."
    )
    with st.form("sql_form", border=False):
        st.text_area("Query", key="sql_text", placeholder=SQL_EXAMPLE, height=90)
        asked = st.form_submit_button("Run query", icon=":material/play_arrow:")
    if asked:
        sql = st.session_state.get("sql_text", "").strip() or SQL_EXAMPLE
        gate = _one_query()
        if not gate.acquire(blocking=False):
            st.session_state["sql_answer"] = BUSY
        else:
            try:
                with st.spinner("Bringing the runs' Parquet export up to date, then querying…"):
                    result = query_root(
                        root,
                        sql,
                        cache_home=cache or _sql_scratch(),
                        now=datetime.now(timezone.utc),
                        timeout_s=SQL_TIMEOUT_S,
                        max_rows=SQL_MAX_ROWS,
                        max_bytes=SQL_MAX_BYTES,
                    )
                st.session_state["sql_answer"] = result
            except STORE_ERRORS as exc:
                st.session_state["sql_answer"] = reason_text(exc, root)
            finally:
                gate.release()
    answer = st.session_state.get("sql_answer")
    with st.container(key="sql_answer"):
        if isinstance(answer, str):
            st.error(f"Query failed: {answer}", icon=":material/error:")
        elif answer is not None:
            table = answer.table
            if answer.over_bytes is not None:
                st.caption(f"The first {table.num_rows:,} rows: the whole answer is over {SQL_MAX_BYTES >> 20} MB.")
            elif answer.truncated:
                st.caption(f"The first {SQL_MAX_ROWS:,} rows.")
            st.dataframe(table, hide_index=True)
            csv_button("Download CSV", functools.partial(answer_csv, table), "query.csv", "sql_csv")


def answer_csv(table: pa.Table) -> str:
    """A query's answer as the box's CSV download: a cell or column name that starts like a
    formula kept text (``csv_frame``), since run names, keys and values are another user's data."""
    return csv_frame(table.to_pandas()).to_csv(index=False)
