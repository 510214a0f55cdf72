"""``python -m metrics_core query ROOT SQL``: one read-only SQL query over every run, printed as a table or CSV.

The statement check, the export and the locked-down connection are ``metrics_core.sql.query``'s;
this command reads its options, exports a runs root into the cache first (an export directory is
read as it is; on a terminal, stderr shows a bar of the runs' bytes read) and prints the rows: an
aligned table of at most ``--max-rows`` (1,000 by default) and ``TABLE_BYTES``, or CSV streamed
batch by batch; text from the runs cleaned for the terminal in both (``text.clean``), and in CSV
kept text in a spreadsheet too (``text.csv_cell``).  ``--timeout`` covers the whole command: the
export, the query and its printing.  Exit status 0 when done, 2 when refused or failed (one line
on stderr).  Importing it loads neither DuckDB nor pyarrow.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from metrics_core.cli.command import add_cache_dir, add_quiet, cache_home
from metrics_core.cli.progress import BYTES, progress_bar
from metrics_core.sql.query import QueryError, check_read_only, export_for_query, is_export, spill_directory
from metrics_core.sql.query_process import query_export
from metrics_core.sql.query_views import help_text
from metrics_core.text import clean, csv_cell, fit, width

if TYPE_CHECKING:
    import pyarrow as pa

    from metrics_core.cli.command import Subcommands

NAME = "query"
TABLE_ROWS = 1000  # rows a table shows without --max-rows: CSV is for more
TABLE_BYTES = 256 << 20  # what a table keeps in memory to align its columns, whatever --max-rows says


def add_parser(commands: Subcommands) -> None:
    """``query ROOT SQL [--format table|csv] [--max-rows N] [--timeout S] [--cache-dir DIR] [--quiet]``."""
    parser = commands.add_parser(
        NAME,
        help="one read-only SQL query over every run (DuckDB; needs metrics-core[sql])",
        description="One read-only SQL query (SELECT) over every run, through DuckDB. ROOT is a runs root (exported "
        "first, incrementally, into the cache directory) or an export directory.",
        epilog=help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("root", help="a runs root (a directory or a bucket prefix), or an export made by `export`")
    parser.add_argument("sql", help='the query, e.g. "SELECT run, status, min_train_loss FROM runs"')
    parser.add_argument("--format", choices=("table", "csv"), default="table", help="table (default) or csv")
    parser.add_argument("--max-rows", type=int, default=None, help="print at most this many rows")
    parser.add_argument("--timeout", type=float, default=None, help="stop after this many seconds, export included")
    add_cache_dir(parser)
    add_quiet(parser)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Check the statement, then run it over the root's export (brought up to date) or the export."""
    started = time.monotonic()
    check_read_only(args.sql)  # refused before anything else is loaded or read
    home = cache_home(args)
    export = args.root
    if not is_export(export):
        deadline = None if args.timeout is None else started + args.timeout
        with progress_bar(err, "export", unit=BYTES, quiet=args.quiet) as bar:
            export, report = export_for_query(args.root, home, bar.update, deadline=deadline)
        err.write("".join(clean(line) + "\n" for line in report.lines()[1:]))
        if report.left:
            raise QueryError(f"stopped after {args.timeout:g} s: the export took too long; run it again to go on")
    _print(export, args, out, {"now": datetime.now(timezone.utc), "spill": spill_directory(home),
                               "timeout_s": args.timeout, "started": started})  # fmt: skip
    return 0


def _print(export: Path | str, args: argparse.Namespace, out: TextIO, limits: dict[str, Any]) -> None:
    """Run the query (``query_process.query_export``: in a process of its own, held to its memory
    bound) and print its answer as ``args.format`` says."""
    if args.format == "csv":
        writer = csv.writer(out, lineterminator="\n")
        header: list[bool] = []

        def write(batch: pa.RecordBatch) -> None:
            if not header:
                writer.writerow(map(csv_value, batch.schema.names))
                header.append(True)
            columns = ([csv_value(value) for value in column.to_pylist()] for column in batch.columns)
            writer.writerows(zip(*columns, strict=True))

        result = query_export(export, args.sql, max_rows=args.max_rows, on_batch=write, **limits)
        if not header:
            writer.writerow(map(csv_value, result.table.schema.names))
        return
    limit = args.max_rows if args.max_rows is not None else TABLE_ROWS
    result = query_export(export, args.sql, max_rows=limit, max_bytes=TABLE_BYTES, **limits)
    columns = [column.to_pylist() for column in result.table.columns]
    out.write("".join(line + "\n" for line in table_lines(result.table.schema.names, columns)))
    if result.over_bytes is not None:
        out.write(
            f"(first {result.table.num_rows:,} rows: the rest is over {result.over_bytes >> 20:,} MB; "
            "--format csv streams them all)\n"
        )
    elif result.truncated:
        out.write(f"(first {limit:,} rows; --max-rows N or --format csv for more)\n")


def csv_value(value: Any) -> Any:
    """A value as a CSV cell: text made safe for a terminal and a spreadsheet, the rest as it is."""
    return csv_cell(clean(value)) if isinstance(value, str) else value


def cell_text(value: Any) -> str:
    """A value as a table cell: NULL, numbers as Python writes them, text made safe for a terminal."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NULL"
    if isinstance(value, datetime):
        return value.isoformat()
    return fit(clean(str(value)), 60)


def table_lines(names: Sequence[str], columns: Sequence[Sequence[Any]]) -> list[str]:
    """Columns of values as aligned plain text under a header, numeric columns right-aligned."""
    header = [fit(clean(name), 60) for name in names]
    texts = [[cell_text(value) for value in column] for column in columns]
    widths = [max([width(name), *map(width, column)]) for name, column in zip(header, texts, strict=True)]
    numeric = [all(value is None or isinstance(value, (int, float)) for value in column) for column in columns]

    def line(values: Sequence[str]) -> str:
        parts = [
            " " * (w - width(v)) + v if right else v + " " * (w - width(v))
            for v, w, right in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(row) for row in zip(*texts, strict=True))]
