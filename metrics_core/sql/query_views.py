"""The views every query of ``metrics_core.sql.query`` sees, and what they say of themselves.

``records`` is the export's Parquet files as one Arrow dataset, read by pyarrow (DuckDB's own file
access stays off); ``runs`` and ``sessions`` are tables made from the export's manifest, a run's
status decided at the time given (``runs.run_status``: the clock and the writer's lock move it).
``VIEWS`` names their columns for ``query --help`` and the query box.  Importing this module
loads no pyarrow: the functions that need it import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metrics_core.read.session_model import session_name

if TYPE_CHECKING:
    import pyarrow as pa

    from metrics_core.sql.export import Destination

# The views every query sees: name -> (what a row is, {column: meaning}).
VIEWS: dict[str, tuple[str, dict[str, str]]] = {
    "records": (
        "one row per record of every run, replayed ones included",
        {
            "run": "the run's name under the root",
            "session": "its session_id",
            "session_index": "0, 1, …: the session's place in the run",
            "event": "train, validation, session_start…",
            "step": "the record's step",
            "tokens_seen": "tokens trained so far",
            "skipped_updates": "skipped so far",
            "time": "when it was written (UTC)",
            "superseded": "true when a later session redid it (resumed before it)",
            "config": "a config record's config as JSON, a key read by its path: config->>'$.optim.lr'",
            "<key>": 'every other field under its own name: train_loss, lr, val_loss, "sys/gpu_mem_gb"…',
        },
    ),
    "runs": (
        "one row per run",
        {
            "run": "its name",
            "status": "live, stalled, finished, interrupted, failed, crashed, empty (now)",
            "reason": "why it stopped",
            "sessions": "how many",
            "records": "how many",
            "superseded_records": "records a later session redid",
            "last_step": "of its last record",
            "tokens_seen": "of its last record",
            "started": "its first record (UTC)",
            "last_record_time": "its last record (UTC)",
            "min_train_loss": "over records no later session redid",
            "last_train_loss": "of its last train record",
            "min_val_loss": "over records no later session redid",
            "bad_lines": "lines that are no record",
            "file": "its Parquet file",
        },
    ),
    "sessions": (
        "one row per session of every run",
        {
            "run": "its run",
            "session": "its session_id",
            "session_index": "0, 1, …",
            "name": "S1, S2, …: as the pages, tail and summary call it",
            "first_step, last_step": "of its first and last record",
            "records": "it wrote",
            "own_records_superseded": "of its records, those a later session redid",
            "min_train_loss": "over all its train records",
            "start_time, end_time": "its first and last record (UTC)",
            "downtime_s": "since the previous session",
            "steps_replayed, tokens_replayed, records_superseded": "earlier work its resume redid",
            "end_status, end_error": "from its session_end",
            "discarded_bytes, resumed_from_step": "from its session_start",
        },
    ),
}


CONFIG_EXAMPLE = (
    "  SELECT DISTINCT r.run, c.config->>'$.optim.lr' AS lr, r.min_val_loss\n"
    "  FROM runs r JOIN records c USING (run) WHERE c.event = 'config' ORDER BY r.min_val_loss"
)


def help_text() -> str:
    """The views and their columns, as ``query --help`` lists them."""
    lines = ["views:"]
    for view, (row, columns) in VIEWS.items():
        lines.append(f"  {view}: {row}")
        lines += [f"    {name:<28} {meaning}" for name, meaning in columns.items()]
    lines += [
        "",
        "a sweep's config keys beside its results (a resumed run logs its config once a session):",
        CONFIG_EXAMPLE,
    ]
    return "\n".join(lines)


def records_view(export: Destination, entries: Mapping[str, Mapping[str, Any]]) -> Any:
    """The records as one Arrow dataset over every run's file, with the columns of all of them
    (a column a file lacks reads as nulls; types joined by ``export_table.common_type``), read by
    pyarrow from the export's file system (DuckDB's own file access stays off)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from metrics_core.sql.export import read_schema
    from metrics_core.sql.export_table import common_type

    types: dict[str, list[pa.DataType]] = {}
    for entry in entries.values():
        for column in read_schema(entry):
            types.setdefault(column.name, []).append(column.type)
    if not types:
        from metrics_core.sql.export_table import RECORD_COLUMNS

        return pa.table({name: pa.array([], pa.string()) for name in RECORD_COLUMNS})
    schema = pa.schema([(name, common_type(kinds)) for name, kinds in types.items()])
    files = [export.path(entry["file"]) for entry in entries.values()]
    return ds.dataset(files, schema=schema, format="parquet", filesystem=export.filesystem)


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def runs_view(entries: Mapping[str, Mapping[str, Any]], now: datetime) -> pa.Table:
    """The ``runs`` view: one row per manifest entry, its status decided at ``now``."""
    import pyarrow as pa

    from metrics_core.read.run_status import StatusRecord, run_status, stop_reason

    rows = []
    for name, entry in entries.items():
        facts = dict(entry["status"])
        source = StatusRecord(
            **{
                **facts,
                "path": Path(facts["path"]),
                "within": Path(facts["within"]) if facts.get("within") else None,
                "identity": tuple(facts["identity"]),
                "last_record_time": _time(facts["last_record_time"]),
            }
        )
        status = run_status(source, now=now)
        rows.append(
            {
                "run": name,
                "status": status,
                "reason": stop_reason(source, status),
                **{
                    key: entry[key] for key in ("sessions", "records", "superseded_records", "last_step", "tokens_seen")
                },
                "started": _time(entry["started"]),
                "last_record_time": source.last_record_time,
                **{
                    key: entry[key]
                    for key in ("min_train_loss", "last_train_loss", "min_val_loss", "bad_lines", "file")
                },
            }
        )
    time = pa.timestamp("us", tz="UTC")
    schema = pa.schema(
        [
            ("run", pa.string()),
            ("status", pa.string()),
            ("reason", pa.string()),
            ("sessions", pa.int64()),
            ("records", pa.int64()),
            ("superseded_records", pa.int64()),
            ("last_step", pa.int64()),
            ("tokens_seen", pa.int64()),
            ("started", time),
            ("last_record_time", time),
            ("min_train_loss", pa.float64()),
            ("last_train_loss", pa.float64()),
            ("min_val_loss", pa.float64()),
            ("bad_lines", pa.int64()),
            ("file", pa.string()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def sessions_view(entries: Mapping[str, Mapping[str, Any]]) -> pa.Table:
    """The ``sessions`` view: one row per session the manifest's entries hold."""
    import pyarrow as pa

    time, whole, text = pa.timestamp("us", tz="UTC"), pa.int64(), pa.string()
    schema = pa.schema(
        [
            ("run", text),
            ("session", text),
            ("session_index", whole),
            ("name", text),
            ("first_step", whole),
            ("last_step", whole),
            ("records", whole),
            ("own_records_superseded", whole),
            ("min_train_loss", pa.float64()),
            ("start_time", time),
            ("end_time", time),
            ("downtime_s", pa.float64()),
            ("steps_replayed", whole),
            ("tokens_replayed", whole),
            ("tokens_replayed_is_upper_bound", pa.bool_()),
            ("records_superseded", whole),
            ("first_tokens_seen", whole),
            ("last_tokens_seen", whole),
            ("skipped_updates", whole),
            ("discarded_bytes", whole),
            ("resumed_from_step", whole),
            ("end_status", text),
            ("end_error", text),
        ]
    )
    rows = []
    for name, entry in entries.items():
        for row in entry["session_rows"]:
            rows.append(
                {
                    **row,
                    "run": name,
                    "session": row["session_id"],
                    "session_index": row["index"],
                    "name": session_name(row["index"]),
                    "start_time": _time(row["start_time"]),
                    "end_time": _time(row["end_time"]),
                }
            )
    return pa.Table.from_pylist(rows, schema=schema)
