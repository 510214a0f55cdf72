"""What one line of ``metrics.jsonl`` must be to count as a record, decided in pure Python.

This is the single definition of a valid record for every reader: ``RunReader`` (which may
parse large blocks with pyarrow, but accepts pyarrow's answer only where it provably agrees with
this module, and otherwise re-parses the lines here) and the terminal tools on training nodes,
which have no numpy or pandas.  Importing it costs orjson only.

A complete line is a record when all of this holds; otherwise it is a *bad line*, skipped and
counted with its line number and the reason below, and never fatal:

* at most ``MAX_RECORD_BYTES`` bytes (1 MiB by default, configurable per reader).  Longer lines
  are refused by their length alone, never parsed: a hostile 50 MB line costs a scan, not a parse;
* UTF-8 JSON (RFC 8259: no ``NaN``/``Infinity`` literals, no lone surrogates, no number that
  overflows a double) whose top level is an object of at most ``MAX_FIELDS`` keys;
* the base fields are present with their types: ``schema_version``, ``step``, ``tokens_seen``,
  ``skipped_updates`` integers in the signed 64-bit range; ``time``, ``run_id``, ``session_id``,
  ``event`` strings; no base field repeated (which copy would place the record is a guess);
* ``time`` is ISO-8601 (anything ``datetime.fromisoformat`` reads) between 1677-09-21 and
  2262-04-11, the range a nanosecond timestamp holds; without a zone it is taken as UTC.

Decided and documented in docs/FORMAT.md, not errors: a CRLF line ending (``\\r`` is JSON
whitespace); a repeated *value* key, whose last copy wins as in JSON.parse and Python's json;
negative counters (a hand-written file may count down; the reader does not judge); a value
integer beyond the signed 64-bit range, read as the nearest float.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from operator import itemgetter, methodcaller
from typing import Any

import orjson

from metrics_core.write.writer import BASE_FIELD_ORDER, BASE_FIELDS

MAX_RECORD_BYTES = 1 << 20
MAX_FIELDS = 4096
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# The nanosecond range pandas and numpy datetimes hold (int64 minimum is NaT).
TIME_MIN_NS, TIME_MAX_NS = INT64_MIN + 1, INT64_MAX
EXCERPT_BYTES = 80

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
# The base fields that are strings; every other base field is an int (the columnar path reads them so too).
STRING_FIELDS = frozenset(("time", "run_id", "session_id", "event"))
_BASE_TYPES = {name: (str if name in STRING_FIELDS else int) for name in BASE_FIELD_ORDER}
_BASE_TUPLE = tuple(_BASE_TYPES[name] for name in BASE_FIELD_ORDER)
_INT_FIELDS = tuple(name for name in BASE_FIELD_ORDER if name not in STRING_FIELDS)
# Each base key once at the top level, as the writer produces it.  Counting them in the raw bytes
# is cheap; only a line where the count is off (a repeat, a nested "step" key) or that holds a
# \u escape (which can spell a key name: "\u0073tep" is "step") pays for the exact check with
# the standard library's pairs hook.
_BASE_KEY = re.compile(rb'"(?:' + b"|".join(name.encode() for name in BASE_FIELD_ORDER) + rb')"\s*:')
_base_values = itemgetter(*BASE_FIELD_ORDER)
_COLONS = methodcaller("count", b":")
# The writer's time, ``YYYY-MM-DDTHH:MM:SS.ffffff+00:00``: its second, with the dot after it, is
# parsed once (cached).
_WRITER_SECOND = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.", re.ASCII)
_SECOND_CACHE: dict[str, int | None] = {}  # see _second_ns
_SECOND_CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class BadLine:
    """A complete line that was skipped: its 1-based line number (None where the reader did not
    start at the file's start), why, its first bytes, and its byte offset where known."""

    line: int | None
    reason: str
    excerpt: str
    offset: int | None = None

    @property
    def where(self) -> str:
        return f"line {self.line:,}" if self.line is not None else f"byte {self.offset:,}"


def excerpt(line: bytes) -> str:
    """The first bytes of a line as text, for messages: never the whole of a hostile line."""
    return line[:EXCERPT_BYTES].decode("utf-8", "replace") + ("…" if len(line) > EXCERPT_BYTES else "")


def time_ns(text: str) -> int | None:
    """``text`` as integer nanoseconds since the epoch (exact, whole microseconds), or None."""
    micros = _iso_micros(text)
    if micros is None:
        return None
    stamp = micros * 1000
    return stamp if TIME_MIN_NS <= stamp <= TIME_MAX_NS else None


def _iso_micros(text: str) -> int | None:
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return (when - _EPOCH) // _MICROSECOND  # exact integer arithmetic, any year
    except (ValueError, OverflowError):
        return None


def _second_ns(prefix: str) -> int | None:
    """Nanoseconds since the epoch of a writer-shaped ``YYYY-MM-DDTHH:MM:SS.`` UTC (cached), or None,
    also when some microsecond of that second lies outside the nanosecond range (near its ends,
    the exact check decides each time alone)."""
    try:
        return _SECOND_CACHE[prefix]
    except KeyError:
        if len(_SECOND_CACHE) >= _SECOND_CACHE_SIZE:
            _SECOND_CACHE.clear()
        micros = _iso_micros(prefix[:19] + "+00:00") if _WRITER_SECOND.fullmatch(prefix) else None
        stamp = None if micros is None else micros * 1000
        if stamp is not None and not TIME_MIN_NS <= stamp <= TIME_MAX_NS - 999_999_000:
            stamp = None
        _SECOND_CACHE[prefix] = stamp
        return stamp


def check_record(line: bytes, *, max_bytes: int = MAX_RECORD_BYTES) -> dict[str, Any] | str:
    """The record with ``time`` as int ns since the epoch, or the reason the line is bad.

    ``line`` is one complete line without its ``\\n``.  See the module docstring for the rules.
    """
    if len(line) > max_bytes:
        return f"line of {len(line):,} bytes is longer than the {max_bytes:,}-byte record limit"
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"invalid JSON: {exc}"
    if type(obj) is not dict:
        return f"not a JSON object but a {type(obj).__name__}"
    if len(obj) > MAX_FIELDS:
        return f"{len(obj):,} fields, more than the {MAX_FIELDS:,}-field record limit"
    if not (obj.keys() >= BASE_FIELDS and tuple(map(type, map(obj.__getitem__, BASE_FIELD_ORDER))) == _BASE_TUPLE):
        for name in BASE_FIELD_ORDER:
            if name not in obj:
                return f"missing base field {name!r}"
            if type(obj[name]) is not _BASE_TYPES[name]:
                return f"base field {name!r} is {_short(obj[name])}, expected {_BASE_TYPES[name].__name__}"
    for name in _INT_FIELDS:
        if not INT64_MIN <= obj[name] <= INT64_MAX:
            return f"base field {name!r} is {obj[name]}, outside the signed 64-bit range"
    if len(_BASE_KEY.findall(line)) != len(BASE_FIELD_ORDER) or b"\\u" in line:
        repeated = _repeated_base_field(line)
        if repeated:
            return f"base field {repeated!r} appears more than once"
    stamp = time_ns(obj["time"])
    if stamp is None:
        return f"time {_short(obj['time'])} is not ISO-8601 within the years 1678–2262"
    obj["time"] = stamp
    return obj


def check_lines(
    block: bytes, first_line: int, *, max_bytes: int = MAX_RECORD_BYTES, lines: list[bytes] | None = None
) -> tuple[list[dict[str, Any]], list[BadLine], int]:
    """``check_record`` of every line of ``block`` (complete lines, ending in ``\\n``); ``lines``:
    those lines without their newlines, where the caller has them (``line_follower.Lines.lines``).

    Returns the records (``time`` in ns), the bad lines numbered from ``first_line``, and the
    number of lines; blank lines are neither.  Each line gets exactly ``check_record``'s answer:
    a line that leaves the fast path below is handed to ``check_record`` itself.

    Cost: a writer's line costs ``orjson.loads`` plus about half of ``check_record``'s own checks,
    because what needs no per-line answer is checked once per block:

    * the limits: a block of at most ``max_bytes`` bytes and ``MAX_FIELDS`` colons holds no line
      over either (a key needs a colon), so only a larger block measures its lines, in C loops;
      one with a line over a limit gives every line to ``check_record``;
    * a line that is not a JSON object fails ``orjson.loads`` or the lookup of its base fields;
    * the int64 range: four values in [0, 2**63) are recognised by one ``|`` and a shift;
    * no repeated key: with no escape in the block, every key occurrence needs its own ``:``,
      and the writer's time holds three; so when the block's colons number exactly the distinct
      keys plus three per fast-path record (plus the colons of the other lines), no fast-path
      record holds a key twice: one ``bytes.count`` per block instead of a regex per line;
    * the time: the writer's format is parsed once per distinct second, then six ASCII digits;
      the range is checked with the second, which is cached only when wholly inside it.
    """
    if lines is None:
        lines = block.split(b"\n")
        lines.pop()  # what follows the last newline: nothing
    rows: list[dict[str, Any]] = []
    bad: list[BadLine] = []
    in_block = block.count(b":")
    within = _within_limits(block, lines, in_block, max_bytes)
    loads, base_values, second_ns = orjson.loads, _base_values, _second_ns
    prefix, second = "", None
    colons = 0  # what the block's colon count must be if no fast-path record repeats a key
    for number, line in enumerate(lines, start=first_line):
        try:
            if not within:
                raise TypeError  # a line over a limit is refused unparsed by check_record
            obj = loads(line)
            version, when, run_id, session, event, step, tokens, skipped = base_values(obj)
        except (orjson.JSONDecodeError, KeyError, TypeError):
            if line.strip():  # a blank line is neither a record nor a bad line
                colons += _exact(line, number, max_bytes, rows, bad)
            continue
        if (
            type(when) is str
            and type(version) is int
            and type(step) is int
            and type(tokens) is int
            and type(skipped) is int
            and type(run_id) is str
            and type(session) is str
            and type(event) is str
            and not (version | step | tokens | skipped) >> 63
            and len(when) == 32
            and when[26:] == "+00:00"
        ):
            if when[:20] != prefix:  # the second and the dot after it
                prefix = when[:20]
                second = second_ns(prefix)
            digits = when[20:26]
            if second is not None and digits.isdigit() and digits.isascii():
                obj["time"] = second + int(digits) * 1000
                rows.append(obj)
                continue
        colons += _exact(line, number, max_bytes, rows, bad)
    colons += sum(map(len, rows)) + 3 * len(rows)  # every record as if fast: _exact took its own back
    if in_block != colons or b"\\" in block:
        rows, bad = _check_repeats(rows, bad, lines, first_line)
    return rows, bad, len(lines)


def _within_limits(block: bytes, lines: list[bytes], colons: int, max_bytes: int) -> bool:
    """Whether no line of ``block`` (split into ``lines``, holding ``colons`` colons) is over
    ``max_bytes`` bytes or can hold over ``MAX_FIELDS`` keys."""
    return (len(block) <= max_bytes or max(map(len, lines), default=0) <= max_bytes) and (
        colons <= MAX_FIELDS or max(map(_COLONS, lines), default=0) <= MAX_FIELDS
    )


def _exact(line: bytes, number: int, max_bytes: int, rows: list[dict[str, Any]], bad: list[BadLine]) -> int:
    """``check_record`` of one line into ``rows`` or ``bad``; returns the line's colons, less those
    ``check_lines`` counts for every record after its loop (one per key, three in the time)."""
    checked = check_record(line, max_bytes=max_bytes)
    if isinstance(checked, str):
        bad.append(BadLine(number, checked, excerpt(line)))
        return line.count(b":")
    rows.append(checked)
    return line.count(b":") - len(checked) - 3


def _check_repeats(
    rows: list[dict[str, Any]], bad: list[BadLine], lines: list[bytes], first_line: int
) -> tuple[list[dict[str, Any]], list[BadLine]]:
    """``check_record``'s repeated-key rule on every record of a block whose colon count was off.

    Rows are in line order and every non-blank line gave a row or a bad line, so walking both
    pairs each row with its line.  Rows ``check_record`` accepted pass this rule again.
    """
    bad_numbers = {item.line for item in bad}
    rows_iter = iter(rows)
    kept: list[dict[str, Any]] = []
    found: list[BadLine] = []
    for number, line in enumerate(lines, start=first_line):
        if number in bad_numbers or not line.strip():
            continue
        row = next(rows_iter)
        suspect = len(_BASE_KEY.findall(line)) != len(BASE_FIELD_ORDER) or b"\\u" in line
        repeated = suspect and _repeated_base_field(line)
        if repeated:
            found.append(BadLine(number, f"base field {repeated!r} appears more than once", excerpt(line)))
        else:
            kept.append(row)
    if found:
        bad = sorted(bad + found, key=lambda item: item.line)
    return kept, bad


def _repeated_base_field(line: bytes) -> str | None:
    """The first base field the line's top-level object holds twice (exact, slow path).

    ``object_pairs_hook`` sees every object innermost first, so its last call is the top level.
    """
    top: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        top[:] = [key for key, _ in items]
        return {}  # values are not needed: only the top level's keys matter

    try:
        json.loads(line, object_pairs_hook=pairs)
    except RecursionError:  # nesting orjson accepts (<= 1024) but this parser does not
        return None
    return next((name for name in BASE_FIELD_ORDER if top.count(name) > 1), None)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"
