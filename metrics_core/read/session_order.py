"""The sessions of a run in file order, found without reading the file: what ``tail -n`` needs to
call a record's session S1, S2… (``session_model.session_name``) as the pages do, while it reads
only the end of the file.

Assumed: one writer at a time (the writer's lock, docs/FORMAT.md), so each session's records are
contiguous: two records of one session have only that session's records between them.  Then the
sessions are found by bisection, probing one record at a time: O(sessions × log(size)) reads of a
few KB, whatever the file's size (``tail -n 10`` of a 5 GB file stays a few reads).  A file that
breaks the assumption (a session id written again after another's records) may get names that
differ from the pages', which count sessions by their first record (``session_accounting``).
Probes skip bad lines as every reader does (``records.check_record``); a stretch of bad bytes longer
than a probe reads holds no session as far as this module knows.
"""

from __future__ import annotations

import os
from pathlib import Path

from metrics_core.read.records import MAX_RECORD_BYTES, check_record
from metrics_core.read.run_file import open_regular

PROBE_CHUNK = 8 << 10  # bytes per read of a probe: a few records of a typical run


def session_order(
    path: Path, *, end: int, max_record_bytes: int = MAX_RECORD_BYTES, within: Path | None = None
) -> list[str]:
    """The session ids of the records in the file's first ``end`` bytes (complete lines), in the
    order their first records come (module docstring: under the one-writer assumption).
    ``within``: as ``run_file.open_regular`` takes it."""
    fd = open_regular(path, within=within)
    try:
        probe = _Probe(fd, end, max_record_bytes)
        first, last = probe.after(0, end), probe.last()
        if first is None or last is None:
            return []
        order = {first[1]: None}
        pending = [(first, last)]  # intervals of the file, the earliest last: popped in file order
        while pending:
            low, high = pending.pop()
            if low[1] == high[1]:
                continue  # contiguous sessions: nothing else between two records of one session
            middle = probe.after((low[0] + high[0]) // 2, high[0])
            if middle is None:  # no record between them: high starts its session
                order.setdefault(high[1], None)
            else:
                pending += [(middle, high), (low, middle)]
        return list(order)
    finally:
        os.close(fd)


class _Probe:
    """Single records of an open file, found near an offset: (where its line starts, its session id)."""

    def __init__(self, fd: int, end: int, max_record_bytes: int) -> None:
        self.fd, self.end, self.max_record_bytes = fd, end, max_record_bytes
        self.limit = 2 * max_record_bytes + PROBE_CHUNK  # a probe reads past at most one overlong line

    def _record(self, line: bytes, start: int) -> tuple[int, str] | None:
        checked = check_record(line, max_bytes=self.max_record_bytes)
        return (start, checked["session_id"]) if isinstance(checked, dict) else None

    def after(self, offset: int, before: int) -> tuple[int, str] | None:
        """The first record whose line starts after ``offset`` (at it, for 0) and before
        ``before``; None when there is none within ``limit`` bytes."""
        stop = min(self.end, offset + self.limit)
        data, base, at = b"", offset, 0 if offset == 0 else None  # at: where data's next line starts
        read_to = offset
        while True:
            if at is None and (newline := data.find(b"\n")) >= 0:
                at = newline + 1
            while at is not None and (newline := data.find(b"\n", at)) >= 0:
                if base + at >= before:
                    return None
                if found := self._record(data[at:newline], base + at):
                    return found
                at = newline + 1
            if read_to >= stop:
                return None
            chunk = os.pread(self.fd, min(PROBE_CHUNK, stop - read_to), read_to)
            if not chunk:
                return None
            if at is None:  # still inside the line the offset fell in: its bytes are not needed
                data, base = chunk, read_to
            else:
                data, base, at = data[at:] + chunk, base + at, 0
            read_to += len(chunk)

    def last(self) -> tuple[int, str] | None:
        """The last record of the complete lines, reading back in reads that double."""
        line_end, step = self.end, PROBE_CHUNK  # line_end: where the earliest line checked starts
        while line_end > 0 and step <= 2 * self.limit:
            start = max(0, line_end - step)
            step *= 2
            lines = os.pread(self.fd, line_end - start, start).split(b"\n")[:-1]
            for line in reversed(lines if start == 0 else lines[1:]):  # the first is whole only at 0
                line_end -= len(line) + 1
                if found := self._record(line, line_end):
                    return found
            if start == 0:
                return None
        return None
