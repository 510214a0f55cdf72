"""A reader's columnar cache: the parse restored when the file is opened, and saved as it grows.

``RunReader`` keeps a columnar copy of its parse through this mixin, so that a reader opened later,
in this process or another, parses only the bytes appended since (``metrics_core.read.column_cache``
holds the format, what makes a cached parse match its file, and the rules of ``CachePolicy``).
Opening the file, the reader continues from a matching cached parse (``_load_cache``, the
``LineFollower``'s ``on_open``); after a refresh that parsed enough it saves, or says a save is
due (``cache_due``) for its owner to write on a thread of its own (``capture_cache``, then
``cache_written``): the dashboard's store does that, so a page's refresh never pays for a save.
"""

from __future__ import annotations

from collections.abc import Callable

from metrics_core.read import column_cache as cache
from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.column_table import Table
from metrics_core.read.line_follower import LineFollower
from metrics_core.read.records import BadLine
from metrics_core.read.run_file import RunFile
from metrics_core.read.session_accounting import SessionLog


class ReaderCache:
    """The cache calls of a reader that holds its parse in ``log``, ``_tables`` and the bad-line
    counters, is fed by ``_follower`` from ``file``, and defines ``_clear`` (forget the parse),
    ``_flush`` (columnarise pending rows) and ``_lines`` (lines read): ``RunReader``."""

    cache: CachePolicy | None
    file: RunFile
    log: SessionLog
    max_record_bytes: int
    bad_lines: int
    bad_line_samples: list[BadLine]
    schema_versions: dict[int, int]
    cache_due: bool  # a save is due and the policy leaves it to the owner (``capture_cache``)
    served_from_cache: bool  # the last (re)open restored the parse from the cache
    _follower: LineFollower
    _tables: dict[str, Table]
    _cache_saved_at: float | None  # clock of the last save or load, None: never
    _cache_lines: int  # lines the cache file holds
    _restored: tuple[int, int] | None  # (records, lines) a refresh's open restored
    _clear: Callable[[], None]
    _flush: Callable[[], None]
    _lines: Callable[[], int]

    def _load_cache(self) -> None:
        """On opening the file: continue from a cached parse of it, when one matches it."""
        self.served_from_cache = False
        key = self.file.cache_key() if self.cache is not None else None
        found = None if key is None else cache.load(self.cache, key, max_record_bytes=self.max_record_bytes)
        if found is None or not self._follower.matches(found.position):
            return
        self._clear()
        self.log, self._tables = found.log, found.tables
        self.bad_lines, self.bad_line_samples = found.bad_lines, list(found.bad_line_samples)
        self.schema_versions = found.schema_versions
        self._follower.resume(found.position)
        self._cache_saved_at, self._cache_lines = self.cache.clock(), found.position.lines
        self.served_from_cache = True
        self._restored = (self.records, found.position.lines)

    def _maybe_save_cache(self, parsed_lines: int) -> None:
        """Save (or, ``save_inline`` off, mark ``cache_due``) after a parse of ``min_records`` lines,
        else at most every ``interval_s`` once cached."""
        policy = self.cache
        if parsed_lines >= policy.min_records or (
            self._cache_saved_at is not None and policy.clock() - self._cache_saved_at >= policy.interval_s
        ):
            self.cache_due = True  # cleared by the capture
            if policy.save_inline:
                self.save_cache()

    def save_cache(self) -> bool:
        """Write the parse so far to the cache now; False (no exception) if it was not written."""
        pending = self.capture_cache()
        return pending is not None and self.cache_written(pending, pending.write())

    def capture_cache(self) -> cache.PendingSave | None:
        """What ``save_cache`` writes, taken in O(columns + sessions) for any thread to write while
        this reader reads on (then ``cache_written``, as its other calls); None: no cache or file."""
        key = None if self.cache is None else self.file.cache_key()
        if key is None:
            return None
        self._flush()
        self.cache_due = False
        parse = cache.CachedParse(
            self._follower.position(),
            self.max_record_bytes,
            SessionLog.restore(self.log.state()),  # a copy: the log keeps changing while the save writes
            self.bad_lines,
            tuple(self.bad_line_samples),
            dict(self.schema_versions),
            cache.frozen_tables(self._tables),
        )
        return cache.PendingSave(self.cache, key, parse)

    def cache_written(self, pending: cache.PendingSave, written: bool) -> bool:
        """Note ``pending``'s outcome: the next save is timed from a write; returns ``written``."""
        if written:
            self._cache_saved_at, self._cache_lines = self.cache.clock(), pending.parse.position.lines
        return written
