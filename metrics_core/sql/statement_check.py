"""The statement check of ``metrics_core.sql.query``: only a statement that reads gets through.

A statement is parsed by DuckDB's own parser (no connection to any data) and refused unless it is
one ``SELECT``, or an ``EXPLAIN`` of one: ``EXPLAIN ANALYZE`` runs what it explains, so the
explained statement is parsed alone, each way the ``EXPLAIN`` head can be read (``_explained_kinds``),
and must be a ``SELECT`` every way.  This is the first of the query module's two locks; the
locked-down connection is the second.  Importing this module does not load DuckDB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from metrics_core.errors import MetricsError

if TYPE_CHECKING:
    import duckdb

ALLOWED_STATEMENTS = ("SELECT", "EXPLAIN")


class QueryError(MetricsError, ValueError):
    """A statement that was refused (it would write or change state) or that failed: why, in one line."""


def check_read_only(sql: str) -> None:
    """Refuse anything but one ``SELECT``, or ``EXPLAIN`` of one (``QueryError``), by DuckDB's own parser."""
    duckdb = load_duckdb()
    parser = duckdb.connect(":memory:")
    try:
        statements = parser.extract_statements(sql)
        if len(statements) != 1:
            raise QueryError(f"refused: one statement at a time, got {len(statements)}")
        kind = statements[0].type.name
        if kind not in ALLOWED_STATEMENTS:
            raise QueryError(f"refused: a {kind} statement; only reading queries (SELECT) are allowed")
        if kind == "EXPLAIN" and (explained := _explained_kinds(parser, sql)) != {"SELECT"}:
            shown = " or ".join(sorted(explained - {"SELECT"})) or "a statement that cannot be read alone"
            raise QueryError(f"refused: EXPLAIN of {shown}; only EXPLAIN of a reading query (SELECT) is allowed")
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse the query: {one_line(exc)}") from None
    finally:
        parser.close()


_EXPLAIN_WORDS = {b"ANALYZE", b"ANALYSE", b"VERBOSE"}


def _explained_kinds(parser: duckdb.DuckDBPyConnection, sql: str) -> set[str]:
    """The kinds of statement an ``EXPLAIN`` statement may explain, each way its head can be read.

    DuckDB's grammar: ``EXPLAIN [ANALYZE|ANALYSE] [VERBOSE] stmt`` or ``EXPLAIN (options) stmt``,
    where ``EXPLAIN (SELECT 1)`` is also a statement in parentheses.  Every place the explained
    statement may start (after each head word, after a parenthesized group) is parsed alone; the
    readings that parse as one statement give their kinds.  DuckDB's own reading is among them, so
    "only SELECT" here means the explained statement is a SELECT however the head is read.
    """
    duckdb = load_duckdb()
    data = sql.encode()  # the tokenizer's offsets count bytes
    tokens = [(at, kind.name) for at, kind in duckdb.tokenize(sql) if kind.name != "comment"]
    starts, index = [], 1  # tokens[0] is EXPLAIN
    while index < len(tokens):
        at = tokens[index][0]
        starts.append(at)
        if data[at : at + 8].split(b"(")[0].strip().upper() in _EXPLAIN_WORDS:
            index += 1
        elif tokens[index][1] == "operator" and data[tokens[index][0] : tokens[index][0] + 1] == b"(":
            index = _after_group(data, tokens, index)
            if index < len(tokens):
                starts.append(tokens[index][0])
            break
        else:
            break
    kinds = set()
    for start in starts:
        try:
            statements = parser.extract_statements(data[start:].decode())
        except duckdb.Error:
            continue  # not where the explained statement starts
        if statements:
            kinds.add(statements[0].type.name if len(statements) == 1 else "several statements")
    return kinds


def _after_group(data: bytes, tokens: list[tuple[int, str]], index: int) -> int:
    """The index of the token after the parenthesized group opened at ``tokens[index]``."""
    depth = 0
    for position in range(index, len(tokens)):
        at, kind = tokens[position]
        if kind == "operator":
            end = tokens[position + 1][0] if position + 1 < len(tokens) else len(data)
            text = data[at:end]
            depth += text.count(b"(") - text.count(b")")
            if depth <= 0:
                return position + 1
    return len(tokens)


def load_duckdb() -> Any:
    """The ``duckdb`` module, or a ``QueryError`` saying how to install it."""
    try:
        import duckdb
    except ImportError:
        raise QueryError("SQL needs DuckDB: pip install 'metrics-core[sql]'") from None
    return duckdb


def one_line(exc: BaseException) -> str:
    """An error's message as one line of at most 300 characters."""
    text = " ".join(str(exc).split())
    return text[:300] + "…" if len(text) > 300 else text or type(exc).__name__
