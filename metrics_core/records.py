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
from typing import Any

import orjson

from metrics_core.writer import BASE_FIELD_ORDER, BASE_FIELDS

MAX_RECORD_BYTES = 1 << 20
MAX_FIELDS = 4096
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# The nanosecond range pandas and numpy datetimes hold (int64 minimum is NaT).
TIME_MIN_NS, TIME_MAX_NS = INT64_MIN + 1, INT64_MAX
EXCERPT_BYTES = 80

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
_STRING_FIELDS = frozenset(("time", "run_id", "session_id", "event"))
_BASE_TYPES = {name: (str if name in _STRING_FIELDS else int) for name in BASE_FIELD_ORDER}
_BASE_TUPLE = tuple(_BASE_TYPES[name] for name in BASE_FIELD_ORDER)
_INT_FIELDS = tuple(name for name in BASE_FIELD_ORDER if name not in _STRING_FIELDS)
# Each base key once at the top level, as the writer produces it.  Counting them in the raw bytes
# is cheap; only a line where the count is off (a repeat, a nested "step" key, an escaped key
# name) pays for the exact check with the standard library's pairs hook.
_BASE_KEY = re.compile(rb'"(?:' + b"|".join(name.encode() for name in BASE_FIELD_ORDER) + rb')"\s*:')


@dataclass(frozen=True, slots=True)
class BadLine:
    """A complete line that was skipped: 1-based line number, why, and its first bytes."""

    line: int
    reason: str
    excerpt: str


def excerpt(line: bytes) -> str:
    """The first bytes of a line as text, for messages: never the whole of a hostile line."""
    return line[:EXCERPT_BYTES].decode("utf-8", "replace") + ("…" if len(line) > EXCERPT_BYTES else "")


def time_ns(text: str) -> int | None:
    """``text`` as integer nanoseconds since the epoch (exact, whole microseconds), or None."""
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        micros = (when - _EPOCH) // _MICROSECOND  # exact integer arithmetic, any year
    except (ValueError, OverflowError):
        return None
    stamp = micros * 1000
    return stamp if TIME_MIN_NS <= stamp <= TIME_MAX_NS else None


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
    if len(_BASE_KEY.findall(line)) != len(BASE_FIELD_ORDER):
        repeated = _repeated_base_field(line)
        if repeated:
            return f"base field {repeated!r} appears more than once"
    stamp = time_ns(obj["time"])
    if stamp is None:
        return f"time {_short(obj['time'])} is not ISO-8601 within the years 1678–2262"
    obj["time"] = stamp
    return obj


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
