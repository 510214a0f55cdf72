"""The runs page's SQL box: one read-only DuckDB query over every run (``metrics_core.sql.query``),
its answer as a data grid with a CSV download.  Kept apart from ``widgets`` because it owns a
job of its own: a scratch export directory, a time limit, an answer kept across reruns."""

from __future__ import annotations

import functools
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import streamlit as st

from metrics_core.dashboard.widgets import STORE_ERRORS, csv_button, reason_text

SQL_TIMEOUT_S = 10.0  # a query box query is interrupted then: the server is shared
SQL_MAX_ROWS = 10_000  # rows a query box shows and downloads; the command line has them all
SQL_EXAMPLE = "SELECT run, status, sessions, last_step, min_train_loss FROM runs ORDER BY min_train_loss"


@functools.cache
def _sql_scratch() -> Path:
    """Where a server started with ``--no-cache`` keeps the export SQL reads: its own temporary
    directory, for its lifetime (never the runs root)."""
    return Path(tempfile.mkdtemp(prefix="metrics-sql-"))


def query_box(root: Path, cache: Path | None) -> None:
    """A read-only SQL query over every run (``metrics_core.sql.query``), under the runs table.

    The statement is refused unless it only reads, and interrupted after ``SQL_TIMEOUT_S``; the
    answer is kept in this session's state, so the page's live reruns keep showing it.  Rows are
    a data grid (text stays text) with a CSV download; a refused or failed query is one escaped
    line of error, and the rest of the page is untouched.
    """
    from metrics_core.sql.query import VIEWS, query_root

    st.subheader("SQL over every run")
    views = ", ".join(f"`{name}`" for name in VIEWS)
    st.caption(
        f"One read-only DuckDB query over the views {views} (`python -m metrics_core query --help` lists their "
        f"columns); stopped after {SQL_TIMEOUT_S:g} s, the first {SQL_MAX_ROWS:,} rows shown."
    )
    with st.form("sql_form", border=False):
        st.text_area("Query", key="sql_text", placeholder=SQL_EXAMPLE, height=90)
        asked = st.form_submit_button("Run query", icon=":material/play_arrow:")
    if asked:
        sql = st.session_state.get("sql_text", "").strip() or SQL_EXAMPLE
        try:
            with st.spinner("Bringing the runs' Parquet export up to date, then querying…"):
                result = query_root(
                    root,
                    sql,
                    cache_home=cache or _sql_scratch(),
                    now=datetime.now(timezone.utc),
                    timeout_s=SQL_TIMEOUT_S,
                    max_rows=SQL_MAX_ROWS,
                )
            st.session_state["sql_answer"] = (result.table.to_pandas(), result.truncated)
        except STORE_ERRORS as exc:
            st.session_state["sql_answer"] = reason_text(exc, root)
    answer = st.session_state.get("sql_answer")
    with st.container(key="sql_answer"):
        if isinstance(answer, str):
            st.error(f"Query failed: {answer}", icon=":material/error:")
        elif answer is not None:
            frame, truncated = answer
            if truncated:
                st.caption(f"The first {SQL_MAX_ROWS:,} rows.")
            st.dataframe(frame, hide_index=True)
            csv_button("Download CSV", lambda: frame.to_csv(index=False), "query.csv", "sql_csv")
