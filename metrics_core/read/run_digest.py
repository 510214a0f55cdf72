"""A run read for the terminal tools (``python -m metrics_core tail|summary``): no numpy or pandas.

Training nodes install ``metrics_core`` alone (README), so the terminal tools must work there.
They read through the same layers as ``RunReader`` up to the sessions: ``run_file`` and
``line_follower`` for the bytes, ``records.check_lines`` for every line,
``session_accounting.SessionLog`` and ``supersession.replay`` for the sessions and what each resume
cost, ``health`` for the findings; so
both tell the same story of a file (``tests/unit/test_digest.py`` checks it on a resumed run).

What it adds:

* ``follow_file`` and ``batches``: a ``LineFollower``'s blocks as records, the lines skipped and why it restarted.
* ``last_records`` answers ``tail -n N`` by reading backwards from the last ``\\n`` in bounded
  chunks: its cost depends on N and line length, not on the file's size.
* ``RunDigest`` keeps what ``summary`` prints as running state (no record kept as a dict):
  sessions, replay accounting, what ``summary.summarise`` reads, and the checks that need no
  pandas.
"""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metrics_core.read.health import ACCOUNTING, MISSING_LOSS, Finding, ingest_findings, session_finding
from metrics_core.read.line_follower import LineFollower, Lines, LongLine, Restart
from metrics_core.read.records import EXCERPT_BYTES, MAX_RECORD_BYTES, BadLine, check_lines, check_record, excerpt
from metrics_core.read.run_file import LocalFile, RunFile, metrics_path, open_regular
from metrics_core.read.run_summary import FollowedLog, LastValue
from metrics_core.read.session_accounting import AccountedSessions
from metrics_core.read.session_model import number
from metrics_core.read.supersession import EventRows
from metrics_core.write.crash_safety import tail_start

BACK_CHUNK = 64 << 10  # backward reads for tail -n: a few records of a typical run per read
RATE_CONTEXT_LINES = 10_000  # tail -n: lines read past the last one printed to find a rate's predecessor


@dataclass(frozen=True, slots=True)
class Batch:
    """Records from one read, in file order, the lines skipped, and why the read restarted (if it did)."""

    records: list[dict[str, Any]]
    skipped: list[BadLine]
    reset: str | None = None


def follow_file(
    path: Path,
    *,
    offset: int = 0,
    line: int | None = 1,
    max_record_bytes: int = MAX_RECORD_BYTES,
    within: Path | None = None,
) -> LineFollower:
    """A ``LineFollower`` of a local metrics file, from ``offset`` (line number ``line`` if known),
    opened now: what changes from here on is noticed.  ``within``: as ``LocalFile`` takes it."""
    follower = LineFollower(LocalFile(path, within=within), max_record_bytes=max_record_bytes, offset=offset, line=line)
    follower.open()
    return follower


def batches(follower: LineFollower, progress: Callable[[int, int], None] | None = None) -> Iterator[Batch]:
    """What ``follower`` finds appended since the last call, parsed by ``records.check_lines``.

    ``progress(offset, size)`` after each batch: how far into the file the read is (one
    ``fstat`` a block of up to ``line_follower.READ_CHUNK`` bytes)."""
    for item in follower.follow():
        if isinstance(item, Restart):
            yield Batch([], [], item.reason)
        elif isinstance(item, LongLine):
            yield Batch([], [item.bad])
        elif isinstance(item, Lines):
            yield _parsed(item, follower.max_record_bytes)
        if progress is not None:
            progress(follower.offset, follower.file.size())


def _parsed(block: Lines, max_record_bytes: int) -> Batch:
    data = block.data[: block.end]
    rows, bad, _ = check_lines(data, block.first_line or 1, max_bytes=max_record_bytes, lines=block.lines)
    if bad:  # place them by offset too, and by offset alone where line numbers are unknown
        first = block.first_line or 1
        starts = [0]  # of the block's lines, up to the last bad one
        position = data.find(b"\n")
        while position >= 0 and len(starts) <= bad[-1].line - first:
            starts.append(position + 1)
            position = data.find(b"\n", position + 1)
        bad = [
            BadLine(
                item.line if block.first_line else None,
                item.reason,
                item.excerpt,
                block.offset + starts[item.line - first],
            )
            for item in bad
        ]
    return Batch(rows, bad)


# -- tail -n, backwards ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tail:
    """The answer of ``last_records``: records in file order, the lines skipped among them, where the
    complete lines end (the torn tail starts there) and the number of the line there if known."""

    records: list[dict[str, Any]]
    context: list[dict[str, Any]]  # train records just before ``records``, for the first rates
    skipped: list[BadLine]
    end: int
    end_line: int | None


def last_records(
    path: Path,
    count: int,
    *,
    keep: Callable[[dict[str, Any]], bool],
    max_record_bytes: int = MAX_RECORD_BYTES,
    chunk: int = BACK_CHUNK,
    progress: Callable[[int, int], None] | None = None,
    within: Path | None = None,
) -> Tail:
    """The last ``count`` records that ``keep`` accepts, reading backwards from the last ``\\n``.

    Reads ``chunk`` bytes at a time and parses only lines it needs: ``tail -n 10`` of a
    5 GB file reads a few chunks.  After the ``count`` records it reads on (at most
    ``RATE_CONTEXT_LINES`` lines) until each session of a printed ``train`` record has an earlier
    ``train`` record or its ``session_start``, so that the first lines printed get their tokens/s.
    Bad lines are located by line number when the scan reached the file's start, else by offset.
    ``progress(scanned, end)`` after each chunk: the bytes read back from the end, of those there are.
    ``within``: the directory the file must lie inside (``run_file.open_regular``).
    """
    fd = open_regular(path, within=within)
    try:
        end = tail_start(fd, os.fstat(fd).st_size)
        found: list[dict[str, Any]] = []  # newest first
        context: list[dict[str, Any]] = []
        skipped: list[tuple[int, int, str, str]] = []  # (offset, lines from the end, reason, excerpt)
        need_rate: set[str] = set()  # sessions whose earliest printed train record lacks a predecessor
        lines_seen = extra_lines = 0
        position, buffer, long_end = end, b"", None  # buffer: bytes [position, boundary)

        def take(line: bytes, offset: int) -> bool:
            """Handle one line (newest first); False once enough is known."""
            nonlocal lines_seen, extra_lines
            lines_seen += 1
            collecting = len(found) < count
            if not collecting:
                extra_lines += 1
                if not need_rate or extra_lines > RATE_CONTEXT_LINES:
                    return False
            if not line.strip():
                return True
            checked = check_record(line, max_bytes=max_record_bytes)
            if isinstance(checked, str):
                if collecting:
                    skipped.append((offset, lines_seen, checked, excerpt(line)))
                return True
            event, session = checked["event"], checked["session_id"]
            kept = collecting and keep(checked)
            if kept:
                found.append(checked)
            if event == "train":
                if kept:
                    need_rate.add(session)  # its predecessor is older still
                elif session in need_rate:
                    context.append(checked)
                    need_rate.discard(session)
            elif event == "session_start":
                need_rate.discard(session)  # the session's first train record has no rate
            return len(found) < count or bool(need_rate)

        going, unread = count > 0, 0
        while going and position > 0:
            start = max(0, position - chunk)
            data = os.pread(fd, position - start, start)
            if long_end is not None:  # inside a line too long to parse: only look for its start
                newline = data.rfind(b"\n")
                if newline < 0 and start > 0:
                    position = start
                    continue
                line_start = start + newline + 1
                lines_seen += 1
                if len(found) < count:
                    length = long_end - line_start
                    reason = f"line of {length:,} bytes is longer than the {max_record_bytes:,}-byte record limit"
                    head = os.pread(fd, EXCERPT_BYTES + 1, line_start)
                    skipped.append((line_start, lines_seen, reason, excerpt(head)))
                long_end, buffer, position = None, data[: newline + 1], start
                continue
            buffer = data + buffer
            position = start
            first = buffer.find(b"\n") if start > 0 else -1
            lines = buffer[first + 1 :].split(b"\n")[:-1]
            offset = start + len(buffer)
            for taken, line in enumerate(reversed(lines), start=1):
                offset -= len(line) + 1
                if not take(line, offset):
                    going, unread = False, len(lines) - taken
                    break
            buffer = buffer[: first + 1]  # a line that began in an earlier chunk, up to its newline
            if going and progress is not None:  # not when the first chunk held the answer: no bar then
                progress(end - position, end)
            if going and len(buffer) > max_record_bytes + 1:
                long_end, buffer = start + len(buffer) - 1, b""  # too long to be a record: find its start
        total = lines_seen + unread if position == 0 and long_end is None else None
        return Tail(
            records=found[::-1],
            context=context[::-1],
            skipped=[
                BadLine(None if total is None else total - back + 1, reason, text, offset)
                for offset, back, reason, text in reversed(skipped)
            ],
            end=end,
            end_line=None if total is None else total + 1,
        )
    finally:
        os.close(fd)


# -- the digest of a whole run -----------------------------------------------------------------


@dataclass(slots=True)
class _Rows:
    """What ``supersession.replay`` needs of one (event, session): its steps and, for train, each
    window's tokens and time and the ``tokens_seen`` counters; ~8-32 bytes a record."""

    steps: array = field(default_factory=lambda: array("q"))
    ordered: bool = True
    tokens: array | None = None
    window_s: array | None = None
    tokens_seen: array | None = None

    def held(self) -> EventRows:
        return EventRows(self.steps, self.ordered, self.tokens, self.window_s, self.tokens_seen)


@dataclass(slots=True)
class _Flagged:
    """Train windows of one session a check flagged: how many and their step range."""

    count: int = 0
    first_step: int = 0
    last_step: int = 0

    def add(self, step: int) -> None:
        if not self.count:
            self.first_step = self.last_step = step
        self.first_step, self.last_step = min(self.first_step, step), max(self.last_step, step)
        self.count += 1


_ACCOUNTING_FIELDS = ("attempted_updates", "updates", "skipped_updates_in_window")
_SUMMARISED = {"train": ("train_loss", "skipped_updates"), "validation": ("val_loss",)}  # what summarise reads


class RunDigest(FollowedLog, AccountedSessions):
    """Everything ``summary`` prints about a run, kept as running state; see the module docstring.

    ``refresh()`` reads what was appended since the last call.  What ``runs.run_status`` reads
    (``run_status.StatusSource``) is here under the names ``RunReader`` gives it.
    """

    def __init__(
        self,
        run: str | os.PathLike[str],
        *,
        max_record_bytes: int = MAX_RECORD_BYTES,
        file: RunFile | None = None,
        within: Path | None = None,
    ) -> None:
        """``file``: where the bytes come from (``metrics_core.read.run_file``; the local file by
        default, which must lie inside ``within`` when given: ``LocalFile``)."""
        self.path = metrics_path(run) if file is None else Path(run)
        self.file = file if file is not None else LocalFile(self.path, within=within)
        self._follower = LineFollower(self.file, max_record_bytes=max_record_bytes)
        self._clear()

    def _clear(self) -> None:
        super()._clear()
        self.run_ids: dict[str, None] = {}
        self._rows: dict[str, dict[int, _Rows]] = {}
        self._last_train_time: dict[int, int] = {}
        self._last: dict[tuple[str, str], LastValue] = {}  # (event, key) -> its last finite number
        self.train_windows = 0
        self._columns: set[str] = set()  # train fields that held a value in some record
        self._accounting: dict[int, _Flagged] = {}
        self._missing_loss: dict[int, _Flagged] = {}

    def close(self) -> None:
        self._follower.close()

    def refresh(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Read the complete lines appended since the last call; return how many records.
        ``progress``: as ``batches`` takes it."""
        before = self.records
        for batch in batches(self._follower, progress):
            if batch.reset is not None:
                self._clear()
                before = 0
            self._add(batch.records)
            self._note_bad(batch.skipped)
        return self.records - before

    def _add(self, records: list[dict[str, Any]]) -> None:
        for record, index in zip(records, self.log.add(records), strict=True):
            event, step = record["event"], record["step"]
            self.run_ids.setdefault(record["run_id"])
            version = record["schema_version"]
            self.schema_versions[version] = self.schema_versions.get(version, 0) + 1
            rows = self._rows.setdefault(event, {}).get(index)
            if rows is None:
                rows = self._rows[event][index] = _Rows()
                if event == "train":
                    rows.tokens, rows.window_s = array("d"), array("d")
                    rows.tokens_seen = array("q")
            if rows.steps and step < rows.steps[-1]:
                rows.ordered = False
            rows.steps.append(step)
            if event == "train":
                self._add_train(record, index, rows)
            if event in _SUMMARISED:
                for key in _SUMMARISED[event]:
                    value = number(record.get(key))
                    if value is not None and math.isfinite(value):
                        self._last[event, key] = LastValue(value, step)

    def _add_train(self, record: dict[str, Any], index: int, rows: _Rows) -> None:
        self.train_windows += 1
        step, when = record["step"], record["time"]
        tokens = number(record.get("tokens"))
        rows.tokens.append(0.0 if tokens is None or math.isnan(tokens) else tokens)
        rows.tokens_seen.append(record["tokens_seen"])
        before = self._last_train_time.get(index)
        rows.window_s.append(0.0 if before is None else (when - before) / 1e9)
        self._last_train_time[index] = when
        self._columns.update(key for key in (*_ACCOUNTING_FIELDS, "train_loss") if record.get(key) is not None)
        attempted, updates, skips = (number(record.get(key)) for key in _ACCOUNTING_FIELDS)
        # As pandas compares the columns: a missing or non-numeric value never adds up.
        if attempted is None or updates is None or skips is None or attempted != updates + skips:
            self._accounting.setdefault(index, _Flagged()).add(step)
        if record.get("train_loss") is None:
            self._missing_loss.setdefault(index, _Flagged()).add(step)

    def last_number(self, event: str, name: str) -> LastValue | None:
        """The last finite number logged as ``name`` by an ``event`` record (the keys a summary
        shows), and its step."""
        return self._last.get((event, name))

    # -- sessions and replay ------------------------------------------------------------------

    def _event_rows(self) -> dict[str, dict[int, EventRows]]:
        """What ``SessionLog.replayed`` reads: each event's rows per session."""
        return {
            event: {index: rows.held() for index, rows in by_session.items()}
            for event, by_session in self._rows.items()
        }

    # -- health checks --------------------------------------------------------------------------

    def checks(self) -> list[Finding]:
        """The checks that need no pandas, each listed once as ``ok`` when it passed, so the reader
        sees what was checked: what reading the file ran into, window accounting, missing loss."""
        findings = ingest_findings(self.ingest_health())
        found = {finding.check for finding in findings}
        if "bad lines" not in found:
            findings.append(Finding("ok", "bad lines", "none"))
        if "torn tail" not in found:
            findings.append(Finding("ok", "torn tail", "the file ends on a complete record"))
        if set(_ACCOUNTING_FIELDS) <= self._columns:
            findings += self._flagged(ACCOUNTING, self._accounting)
        if "train_loss" in self._columns:
            findings += self._flagged(MISSING_LOSS, self._missing_loss)
        return findings

    def _flagged(self, check: tuple[str, str, str], flagged: Mapping[int, _Flagged]) -> list[Finding]:
        name, severity, what = check
        if not flagged:
            return [Finding("ok", name, f"all {self.train_windows:,} train window(s) pass")]
        ids = self.log.session_ids()
        return [
            session_finding(name, severity, ids[index], f.first_step, f.last_step, f.count, what)
            for index, f in sorted(flagged.items())
        ]
