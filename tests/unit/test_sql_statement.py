"""The SQL statement check alone (DuckDB's parser, no data): an EXPLAIN gets through only when what
it explains reads, however its head is written, since ``EXPLAIN ANALYZE`` runs its statement."""

from __future__ import annotations

import pytest

from metrics_core.sql.statement_check import QueryError, check_read_only

pytest.importorskip("duckdb", reason="duckdb (the sql extra) is not installed")

READING = [
    "SELECT 1",
    "EXPLAIN SELECT 1",
    "EXPLAIN ANALYZE SELECT count(*) FROM range(10)",
    "explain analyse select 'é' AS \"ü\"",
    "EXPLAIN (FORMAT json) SELECT 1",
    "EXPLAIN (FORMAT text, ANALYZE) WITH a AS (SELECT 1) SELECT * FROM a",
    "EXPLAIN (SELECT 1)",
    "EXPLAIN ANALYZE (SELECT 1)",
    "EXPLAIN ((SELECT 1))",
    "EXPLAIN FROM range(3)",
    "EXPLAIN ANALYZE VALUES (1)",
    "/* a comment */ EXPLAIN -- another\n ANALYZE SELECT 1",
]

WRITING = [
    ("EXPLAIN ANALYZE CREATE TABLE t AS SELECT 42", "EXPLAIN of CREATE"),
    ("EXPLAIN CREATE TABLE t AS SELECT 42", "EXPLAIN of CREATE"),
    ("EXPLAIN (ANALYZE) CREATE TABLE t AS SELECT 1", "EXPLAIN of CREATE"),
    ("EXPLAIN (FORMAT text, ANALYZE) INSERT INTO t VALUES (1)", "EXPLAIN of INSERT"),
    ("/* x */ EXPLAIN -- y\n ANALYZE COPY (SELECT 1) TO 'x.csv'", "EXPLAIN of COPY"),
    ("explain analyse update t set a = 1", "EXPLAIN of UPDATE"),
    ("EXPLAIN ANALYZE DELETE FROM t", "EXPLAIN of DELETE"),
    ("EXPLAIN ANALYZE SET threads = 1", "EXPLAIN of SET"),
    ("EXPLAIN ANALYZE CALL pragma_version()", "EXPLAIN of CALL"),
    ("EXPLAIN PRAGMA version", "EXPLAIN of PRAGMA"),
    ("EXPLAIN ANALYZE ATTACH 'x.duckdb'", "cannot parse"),
]


@pytest.mark.parametrize("sql", READING)
def test_a_select_and_an_explain_of_one_get_through(sql: str) -> None:
    """Every way of writing an EXPLAIN head over a SELECT is accepted."""
    check_read_only(sql)


@pytest.mark.parametrize(("sql", "why"), WRITING)
def test_an_explain_of_anything_but_a_select_is_refused(sql: str, why: str) -> None:
    """EXPLAIN (ANALYZE or not, options in any form, comments anywhere) of a statement that writes
    or changes state is refused in one line naming the explained kind."""
    with pytest.raises(QueryError, match=r"^(refused|cannot parse)") as refused:
        check_read_only(sql)
    assert why in str(refused.value) and "\n" not in str(refused.value)
