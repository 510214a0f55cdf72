"""Helpers of the read-side tests of more than one tier: diagnostics' windows and findings, files
that are not regular files, and queries over an export."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from metrics_core.read.health import Finding
from metrics_core.read.run_reader import RunReader
from metrics_core.sql.query import connect, run_query
from tests.support import base_record


def window(
    step: int,
    session: str = "s1",
    *,
    tokens: int = 8000,
    seen: int | None = None,
    loss: float = 1.0,
    attempted: int = 10,
    updates: int = 10,
    skipped: int = 0,
    cumulative_skipped: int = 0,
) -> dict:
    """A train record of a 10-step window of 8 batches x 100 tokens per step."""
    return base_record(step, session=session, train_loss=loss, tokens=tokens, attempted_updates=attempted,
                       updates=updates, skipped_updates_in_window=skipped) | {
        "tokens_seen": step * 800 if seen is None else seen, "skipped_updates": cumulative_skipped}  # fmt: skip


def checks(findings: list[Finding]) -> dict[str, Finding]:
    return {finding.check: finding for finding in findings}


KINDS = {"fifo": "is a FIFO (named pipe), not a regular file", "directory": "is a directory, not a regular file"}


def special(path: Path, kind: str) -> Path:
    """Make a FIFO or a directory at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    return path


def written(path: Path) -> list[tuple[int, float]]:
    """(step, train_loss) of every train record, read back through the public reader (no bad line)."""
    reader = RunReader(path)
    reader.refresh()
    assert reader.bad_lines == 0 and reader.pending_bytes == 0
    frame = reader.frame("train")
    return list(zip(frame["step"].tolist(), frame["train_loss"].tolist(), strict=True))


NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


def query(export: Path, sql: str) -> list[tuple]:
    connection = connect(export, now=NOW)
    try:
        table = run_query(connection, sql).table
    finally:
        connection.close()
    return list(zip(*(column.to_pylist() for column in table.columns), strict=True))


def snapshot_files(directory: Path) -> dict[str, tuple[int, int]]:
    return {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in directory.iterdir()}
