"""Helpers of the read-side tests of more than one tier: diagnostics' windows and findings, a
digest checked against the reader, a file that counts its reads, files that are not regular files,
and queries over an export."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from metrics_core.read.health import Finding
from metrics_core.read.run_digest import RunDigest
from metrics_core.read.run_file import LocalFile
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import run_status
from metrics_core.read.run_summary import summarise
from metrics_core.read.session_model import Session
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


class CountingFile(LocalFile):
    """A local run file that counts the bytes read through it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.bytes_read = 0

    def read(self, offset: int, count: int) -> bytes:
        data = super().read(offset, count)
        self.bytes_read += len(data)
        return data


SESSION_FIELDS = (
    "session_id", "index", "first_step", "last_step", "records", "downtime_s", "steps_replayed", "tokens_replayed",
    "tokens_replayed_is_upper_bound", "records_superseded", "discarded_bytes", "resumed_from_step", "end_status",
)  # fmt: skip


def assert_replay_matches_the_masks(reader: RunReader) -> None:
    """The O(rows) oracle of ``supersession.replay``: each session's share of earlier records, from the
    reader's per-row ``redone_by``, and the superseded training time from its frame."""
    sessions = reader.sessions
    for session in sessions[1:]:
        masks = {event: reader.redone_by(event) == session.index for event in reader.events}
        records = sum(int(mask.sum()) for mask in masks.values())
        frontier = max([session.first_step] + [int(reader.frame(event)["step"][mask].max())
                                               for event, mask in masks.items() if mask.any()])  # fmt: skip
        tokens, bound = redone_tokens(reader, session, masks.get("train"))
        assert (session.records_superseded, session.steps_replayed, session.tokens_replayed) == (
            records, frontier - session.first_step, tokens)  # fmt: skip
        assert session.tokens_replayed_is_upper_bound == bound
    train = reader.frame("train")
    window = train.groupby("session_id", observed=True)["time"].diff().dt.total_seconds() if len(train) else None
    wasted = float(window[reader.superseded("train")].sum()) if window is not None else 0.0
    assert reader.lost_work().superseded_time_s == pytest.approx(wasted)


def redone_tokens(reader: RunReader, session: Session, mask: np.ndarray | None) -> tuple[int, bool]:
    """Row by row: a superseded window's tokens, only those after the resume step when the window
    straddles it (from ``tokens_seen``), or all of them, an upper bound, when the counters cannot say."""
    if mask is None or not mask.any():
        return 0, False
    train = reader.frame("train")
    column = reader.column("train", "tokens")
    sizes = np.zeros(len(train)) if column is None else np.nan_to_num(column.numbers())
    first_step = {s.session_id: s.first_step for s in reader.sessions}
    owners, steps, seen = list(train["session_id"]), list(train["step"]), list(train["tokens_seen"])
    total, bound = 0.0, False
    for row in np.flatnonzero(mask):
        before = [other for other in range(row) if owners[other] == owners[row]]
        window_start = steps[before[-1]] if before else first_step[owners[row]]
        resumed = session.first_tokens_seen
        if not window_start < session.first_step < steps[row]:
            total += sizes[row]
        elif seen[row] - sizes[row] <= resumed <= seen[row]:
            total += seen[row] - resumed
        else:
            total, bound = total + sizes[row], True
    return int(total), bound


def assert_agrees_with_reader(path: Path, now: datetime) -> RunDigest:
    """Sessions, replay accounting, lost work, status, summary and bad lines: digest == RunReader."""
    reader = RunReader(path)
    reader.refresh()
    assert_replay_matches_the_masks(reader)
    digest = RunDigest(path)
    digest.refresh()
    assert [tuple(getattr(s, f) for f in SESSION_FIELDS) for s in digest.sessions] == [
        tuple(getattr(s, f) for f in SESSION_FIELDS) for s in reader.sessions
    ]
    times = [(s.start_time, s.end_time) for s in reader.sessions]
    assert [(s.start_time, s.end_time) for s in digest.sessions] == times
    expected = reader.lost_work()
    got = digest.lost_work()
    assert (got.downtime_s, got.steps_replayed, got.tokens_replayed) == pytest.approx(
        (expected.downtime_s, expected.steps_replayed, expected.tokens_replayed)
    )
    assert got.tokens_replayed_is_upper_bound == expected.tokens_replayed_is_upper_bound
    assert (got.superseded_time_s, got.training_time_s) == pytest.approx(
        (expected.superseded_time_s, expected.training_time_s)
    )
    assert (digest.records, digest.bad_lines, digest.pending_bytes, digest.last_event) == (
        reader.records, reader.bad_lines, reader.pending_bytes, reader.last_event)  # fmt: skip
    bad = [(b.line, b.reason) for b in reader.bad_line_samples]
    assert [(b.line, b.reason) for b in digest.bad_line_samples] == bad
    assert (digest.last_record_time, digest.typical_gap_s()) == (reader.last_record_time, reader.typical_gap_s())
    assert run_status(digest, now=now) == run_status(reader, now=now)
    assert summarise(digest, now=now) == summarise(reader, now=now)
    reader.close()
    return digest


def redone_by_oracle(reader: RunReader, event: str) -> np.ndarray:
    """The supersession rule read literally, O(rows × sessions): per row of ``frame(event)``, the
    first later session that began below its step, or at it having logged ``event`` there first."""
    frame, sessions = reader.frame(event), reader.sessions
    index = {session.session_id: session.index for session in sessions}
    rows = [(index[name], int(step)) for name, step in zip(frame["session_id"], frame["step"], strict=True)]
    first_of_event: dict[int, int] = {}
    for session, step in rows:
        first_of_event.setdefault(session, step)
    result = []
    for session, step in rows:
        later = (
            other.index
            for other in sessions[session + 1 :]
            if step > other.first_step or (step == other.first_step and first_of_event.get(other.index) == step)
        )
        result.append(next(later, -1))
    return np.array(result, dtype=np.int64)
