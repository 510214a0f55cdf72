"""No line can break the read path, and both parse paths give one answer for one file.

Every class of hostile line found against the first slice is a regression test here, read through
the public ``RunReader`` by the exact per-line parser, by pyarrow's bulk path, and incrementally,
and a differential fuzz test feeds hypothesis-generated files to all three.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metrics_core.read.records import MAX_FIELDS, MAX_RECORD_BYTES, check_lines, check_record
from metrics_core.read.run_reader import RunReader
from tests.support import HOSTILE, append_bytes, base_record, line, snapshot

PER_LINE, BULK = 1 << 40, 0
TAIL_LINES = 120  # past the 100 good lines that follow a hostile line in test_a_hostile_line_is_one_bad_line
EVENTS = ("train", "validation", "checkpoint", "session_start", "session_end")


def read_all_ways(path: Path, data: bytes) -> list[dict[str, Any]]:
    """Snapshots of ``data`` read whole (per line, bulk, default) and appended line by line (per line, bulk).

    Line by line covers the last ``TAIL_LINES`` lines, after the rest was appended at once: every
    hostile line sits there, and reading 6,000 good lines one refresh each only costs CI time.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    results = []
    for reader in (RunReader(path, bulk_threshold=PER_LINE), RunReader(path, bulk_threshold=BULK), RunReader(path)):
        reader.refresh()
        results.append(snapshot(reader))
    for threshold in (PER_LINE, BULK):
        reader = RunReader(path, bulk_threshold=threshold)
        path.write_bytes(b"")
        reader.refresh()
        pieces = data.splitlines(keepends=True)
        for piece in [b"".join(pieces[:-TAIL_LINES]), *pieces[-TAIL_LINES:]]:
            append_bytes(path, piece)
            reader.refresh()
        results.append(snapshot(reader))
        path.write_bytes(b"")
    return results


# -- each class of hostile line the adversarial review found (support.HOSTILE) -------------------


@pytest.mark.parametrize("hostile", list(HOSTILE), ids=list(HOSTILE))
def test_a_hostile_line_is_one_bad_line_and_hides_nothing(tmp_path: Path, hostile: str) -> None:
    """Around each hostile line (in a file big enough for the bulk path) every valid record is read, whichever way."""
    before = b"".join(line(base_record(step, train_loss=3.0 - step / 1000)) for step in range(1, 6001))
    after = b"".join(line(base_record(step, session="s2", train_loss=1.0)) for step in range(6001, 6101))
    data = before + HOSTILE[hostile] + after
    assert len(data) > 1 << 20  # the cold load goes through pyarrow
    assert data.count(b"\n", len(before)) <= TAIL_LINES  # and the appends one by one go through the hostile line
    results = read_all_ways(tmp_path / "run" / "metrics.jsonl", data)
    for result in results:
        assert result["records"] == 6100
        assert result["bad_lines"] == 1 and result["bad"][0][0] == 6001
        assert result["frames"]["train"]["step"][1] == list(range(1, 6101))
        assert [session.session_id for session in result["sessions"]] == ["s1", "s2"]
    assert all(result == results[0] for result in results[1:])


def test_a_huge_integer_value_reads_as_the_nearest_float_on_both_paths(tmp_path: Path) -> None:
    """A value (not a base field) beyond int64 is kept as the nearest float, never an overflow."""
    records = [base_record(step, tokens=step) for step in range(1, 4)]
    records[1]["tokens"] = 1 << 63
    results = read_all_ways(tmp_path / "run" / "metrics.jsonl", b"".join(map(line, records)))
    assert results[0]["frames"]["train"]["tokens"] == ("float64", [1.0, float(1 << 63), 3.0])
    assert all(result == results[0] for result in results[1:])


def test_crlf_and_a_time_without_zone_are_read_as_documented(tmp_path: Path) -> None:
    """CRLF endings are whitespace; a time without a zone is UTC; a repeated value key: the last wins."""
    data = (
        line(base_record(1, train_loss=2.0))[:-1]
        + b"\r\n"
        + line(base_record(2) | {"time": "2026-11-29T10:00:02"})
        + line(base_record(3))[:-2]
        + b',"lr":1,"lr":2}\n'
        + line(base_record(4) | {"step": -4})
    )
    results = read_all_ways(tmp_path / "run" / "metrics.jsonl", data)
    train = results[0]["frames"]["train"]
    assert results[0]["bad_lines"] == 0
    assert train["time"][1][1] == pd.Timestamp("2026-11-29T10:00:02Z").value
    assert train["lr"][1] == [None, None, 2.0, None]
    assert train["step"][1] == [1, 2, 3, -4]
    assert all(result == results[0] for result in results[1:])


# -- differential fuzz ---------------------------------------------------------------------------

INTS = st.sampled_from([0, 1, -1, 7, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**63) - 1])
FLOATS = st.sampled_from([0.0, -0.0, 1.5, 0.1, 1e308, 5e-324, -2.5e-10, 1e16])
TEXT = st.text(max_size=12) | st.sampled_from(["", "[x](https://evil.example)", "é✓", "a\\u0000b", "<b>x</b>"])
VALUES = INTS | FLOATS | TEXT | st.booleans() | st.none()
GOOD_TIMES = st.sampled_from([
    "2026-11-29T10:00:00.000000+00:00", "2026-11-29T10:00:01.5+00:00", "2026-11-29T11:00:02.123456789+01:00",
    "2026-11-29T10:00:03Z", "2026-11-29T10:00:04", "2026-11-29 10:00:05+00:00", "1677-09-22T00:00:00+00:00",
    "2262-04-10T00:00:00+00:00", "2026-11-29T10:00:06.1234567-05:30", "20261129T100007Z",
])  # fmt: skip
BAD_TIMES = st.sampled_from([
    "1500-01-01T00:00:00+00:00", "2263-01-01T00:00:00+00:00", "0001-01-01T00:00:00+14:00", "yesterday", "",
    "2026-02-30T00:00:00+00:00", "2026-11-29T24:00:00+00:00", "2026-11-29T10:00:60+00:00", "9999-12-31T23:59:59Z",
])  # fmt: skip
LITERALS = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"18446744073709551616", b"true", b"null", b"{}"]
# Built once, here: a strategy built inside a draw is a new object, checked again at every draw.
VERSIONS = st.sampled_from([1, 1, 2])
EVENT_NAMES = st.sampled_from(EVENTS)
SESSIONS = st.sampled_from(["s1", "s2", "s3", "[x](https://e.x)"])
STEPS = st.integers(-3, 40) | st.sampled_from([2**63 - 1, -(2**63)])
VALUE_FIELDS = st.dictionaries(
    st.sampled_from(["train_loss", "lr", "tokens", "status", "note", "flag", "grad_norm_avg"]), VALUES, max_size=5
)
KINDS = st.sampled_from(["mutate", "truncate", "literal", "bad time", "bytes", "duplicate", "blank"])
NOT_NEWLINE = st.integers(0, 255).filter(lambda b: b != 10)
NUMBER_FIELDS = st.sampled_from([b'"step":', b'"tokens_seen":', b'"schema_version":', b'"uid":'])
REPEATED_KEYS = st.sampled_from([b"event", b"step", b"time"])
BLANK_LINES = st.sampled_from([b"\n", b"  \n", b"\r\n", b"\t\n"])
LITERAL_VALUES = st.sampled_from(LITERALS)


@st.composite
def valid_record(draw: st.DrawFn, uid: int) -> dict[str, Any]:
    record = {
        "schema_version": draw(VERSIONS),
        "time": draw(GOOD_TIMES),
        "run_id": "r",
        "session_id": draw(SESSIONS),
        "event": draw(EVENT_NAMES),
        "step": draw(STEPS),
        "tokens_seen": draw(st.integers(0, 10**6)),
        "skipped_updates": draw(st.integers(0, 3)),
    }
    record.update(draw(VALUE_FIELDS))
    record["uid"] = uid
    return record


@st.composite
def hostile_line(draw: st.DrawFn) -> bytes:
    raw = bytearray(line(draw(valid_record(-1))))
    kind = draw(KINDS)
    if kind == "mutate":
        for _ in range(draw(st.integers(1, 4))):
            raw[draw(st.integers(0, len(raw) - 2))] = draw(NOT_NEWLINE)
    elif kind == "truncate":
        raw = raw[: draw(st.integers(0, len(raw) - 2))] + b"\n"
    elif kind == "literal":
        field = draw(NUMBER_FIELDS)
        head, _, rest = bytes(raw).partition(field)
        value_end = min(i for i in (rest.find(b","), rest.find(b"}")) if i >= 0)
        raw = bytearray(head + field + draw(LITERAL_VALUES) + rest[value_end:])
    elif kind == "bad time":
        raw = bytearray(line(draw(valid_record(-1)) | {"time": draw(BAD_TIMES)}))
    elif kind == "bytes":
        raw = bytearray(draw(st.binary(max_size=60)).replace(b"\n", b"") + b"\n")
    elif kind == "duplicate":
        raw = raw[:-2] + b',"' + draw(REPEATED_KEYS) + b'":"x"}\n'
    else:
        raw = bytearray(draw(BLANK_LINES))
    return bytes(raw)


@st.composite
def fuzzed_file(draw: st.DrawFn) -> tuple[bytes, set[int]]:
    parts, valid = [], set()
    for uid in range(draw(st.integers(1, 25))):
        if draw(st.booleans()):
            parts.append(line(draw(valid_record(uid))))
            valid.add(uid)
        else:
            parts.append(draw(hostile_line()))
    if draw(st.booleans()):
        parts.append(b'{"schema_version":1,"time":"2026-')  # an incomplete tail
    return b"".join(parts), valid


@settings(max_examples=int(os.environ.get("METRICS_FUZZ", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(case=fuzzed_file())
def test_both_parse_paths_agree_on_any_file_and_keep_every_valid_record(
    tmp_path: Path, case: tuple[bytes, set[int]]
) -> None:
    """Random bytes, mutated records and numeric edges: no exception, one answer, no valid record lost."""
    data, valid = case
    results = read_all_ways(tmp_path / "fuzz" / "metrics.jsonl", data)
    for result in results[1:]:
        assert result == results[0]
    seen = [uid for frame in results[0]["frames"].values() for uid in frame.get("uid", ("", []))[1]]
    assert valid <= {int(uid) for uid in seen if type(uid) in (int, float) and math.isfinite(uid)}


# -- rewrites in place -------------------------------------------------------------------------


def same_shaped(session: str, second: int, count: int = 50) -> bytes:
    """Lines of one length, all ending in the writer's usual suffix."""
    return b"".join(
        line(base_record(step, session=session) | {"time": f"2026-11-29T10:00:{second:02d}.000000+00:00"})
        for step in range(count)
    )


def replace_with(path: Path, data: bytes) -> None:
    path.with_name("new").write_bytes(data)
    os.replace(path.with_name("new"), path)


def copy_over(path: Path, data: bytes) -> None:
    path.with_name("src").write_bytes(data)
    shutil.copyfile(path.with_name("src"), path)  # same inode: truncate, then write


REWRITES = {
    "truncate and rewrite": lambda path, data: path.write_bytes(data),
    "delete and recreate": lambda path, data: (path.unlink(), path.write_bytes(data)),
    "os.replace": replace_with,
    "cp over": copy_over,
}


@pytest.mark.parametrize("rewrite", list(REWRITES), ids=list(REWRITES))
@pytest.mark.parametrize("grow", [False, True], ids=["same size", "grown"])
def test_a_rewrite_in_place_is_noticed_and_never_mixed(tmp_path: Path, rewrite: str, grow: bool) -> None:
    """A new run written over an old one, same-shaped lines, same or larger size: the reader starts over."""
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_bytes(same_shaped("sA", 1))
    reader = RunReader(path)
    assert reader.refresh() == 50
    new = same_shaped("sB", 2, 60 if grow else 50)
    stat = path.stat()
    REWRITES[rewrite](path, new)
    if not grow:  # like `cp -p`: the same size and modification time as before
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    reader.refresh()
    assert reader.resets == 1, reader.reset_reasons
    assert set(reader.frame("train")["session_id"]) == {"sB"}
    assert reader.records == len(reader.frame("train")) == (60 if grow else 50)


def test_a_torn_tail_cut_and_rewritten_by_the_next_writer_is_read_correctly(tmp_path: Path) -> None:
    """The pending bytes a reader scanned are re-scanned when a resumed writer cuts them and appends."""
    path = tmp_path / "run" / "metrics.jsonl"
    good = line(base_record(1))
    append_bytes(path, good + b'{"schema_version":1,"time":"2026-11-29T10:00:09.0000' + b"0" * 300)
    reader = RunReader(path)
    assert reader.refresh() == 1 and reader.pending_bytes > 300
    with open(path, "r+b") as out:  # what MetricsWriter does on open: cut the torn tail, then append
        out.truncate(len(good))
        out.seek(0, os.SEEK_END)
        out.write(line(base_record(2, session="s2")) + line(base_record(3, session="s2")))
    assert reader.refresh() == 2
    assert reader.bad_lines == 0 and reader.pending_bytes == 0
    assert list(reader.frame("train")["step"]) == [1, 2, 3]
    assert np.all(reader.frame("train")["session_id"].astype(str) == ["s1", "s2", "s2"])


# -- the batch checker gives each line check_record's answer ---------------------------------


def per_line_answers(block: bytes) -> tuple[list[Any], list[tuple[int, str]]]:
    rows, bad = [], []
    for number, raw in enumerate(block.split(b"\n")[:-1], start=1):
        if raw.strip():
            checked = check_record(raw)
            if isinstance(checked, str):
                bad.append((number, checked))
            else:
                rows.append(checked)
    return rows, bad


WRITER_LINE = line(base_record(5, train_loss=1.5, note="a:b"))
TRICKY = {
    "repeat with space before colon": WRITER_LINE[:-2] + b',"step" :6}\n',
    "escaped repeat": WRITER_LINE[:-2] + b',"\\u0073tep":6}\n',
    "escaped key only": WRITER_LINE.replace(b'"step":', b'"\\u0073tep":'),
    "colon-free nested repeat": WRITER_LINE[:-2] + b',"x":{"step":1}}\n',
    "value repeat": WRITER_LINE[:-2] + b',"lr":1,"lr":2}\n',
    "escaped colon in time": WRITER_LINE.replace(b"10:00:05", b"10\\u003a00:05"),
    "time 24:00": WRITER_LINE.replace(b"10:00:05", b"24:00:00"),
    "time Feb 30": WRITER_LINE.replace(b"2026-11-29", b"2026-02-30"),
    "time non-ASCII digit": WRITER_LINE.replace(b".000000+", "١00000+".encode()[:-1] + b"+").replace(b"05.", b"05."),
    "negative step": line(base_record(-5)),
    "step 2^63": line(base_record(5) | {"step": 1 << 63}),
    "time before 1970": line(base_record(5) | {"time": "1969-12-31T23:59:59.500000+00:00"}),
    "last representable microsecond": line(base_record(5) | {"time": "2262-04-11T23:47:16.854775+00:00"}),
    "one microsecond later": line(base_record(5) | {"time": "2262-04-11T23:47:16.854776+00:00"}),
    "blank": b" \r\n",
    "over the field limit": WRITER_LINE[:-2] + b"".join(b',"k%d":1' % i for i in range(MAX_FIELDS)) + b"}\n",
    "over the byte limit": WRITER_LINE[:-2] + b',"pad":"' + b"x" * MAX_RECORD_BYTES + b'"}\n',
    "an array": b"[1, 2]\n",
    "an object after spaces": b"  " + WRITER_LINE,
    "CRLF": WRITER_LINE[:-1] + b"\r\n",
}


@pytest.mark.parametrize("tricky", list(TRICKY), ids=list(TRICKY))
def test_the_batch_checker_gives_each_line_check_records_answer(tricky: str) -> None:
    """Each line that defeats a block-level shortcut (colons, escapes, the time cache) is judged by check_record."""
    block = WRITER_LINE + TRICKY[tricky] + WRITER_LINE
    rows, bad, lines = check_lines(block, 1)
    assert lines == 3
    assert (rows, [(item.line, item.reason) for item in bad]) == per_line_answers(block)


@settings(max_examples=int(os.environ.get("METRICS_FUZZ", "150")), deadline=None)
@given(case=fuzzed_file())
def test_the_batch_checker_agrees_with_check_record_on_any_file(case: tuple[bytes, set[int]]) -> None:
    """check_lines is check_record applied line by line, on any fuzzed file."""
    data = case[0][: case[0].rfind(b"\n") + 1]
    rows, bad, _ = check_lines(data, 1)
    assert (rows, [(item.line, item.reason) for item in bad]) == per_line_answers(data)


@pytest.mark.parametrize("tricky", list(TRICKY), ids=list(TRICKY))
def test_every_read_path_gives_each_tricky_line_check_records_answer(tmp_path: Path, tricky: str) -> None:
    """The bulk path's own shortcuts (one object per line, the writer's time as bytes) agree with check_record."""
    data = WRITER_LINE * 3 + TRICKY[tricky] + WRITER_LINE * 3
    rows, bad = per_line_answers(data)
    results = read_all_ways(tmp_path / "run" / "metrics.jsonl", data)
    assert results[0]["records"] == len(rows) and [item[0] for item in results[0]["bad"]] == [b[0] for b in bad]
    assert all(result == results[0] for result in results[1:])


def test_the_writer_time_shortcut_accepts_only_what_the_time_regex_accepts() -> None:
    """Every one-byte change of a writer time: the byte-matrix check never accepts what the regex refuses."""
    import re

    import pyarrow as pa

    from metrics_core.read.arrow_records import _ARROW_TIME, _writer_times

    writer_time = "2026-11-29T23:59:59.123456+00:00"
    assert _writer_times(pa.chunked_array([[writer_time] * 3, [writer_time]]))
    for position in range(len(writer_time)):
        for char in "0123456789-+:.TZ ١\x00/":
            text = writer_time[:position] + char + writer_time[position + 1 :]
            if _writer_times(pa.chunked_array([[writer_time], [text]])):
                assert re.fullmatch(_ARROW_TIME, text), text
    assert not _writer_times(pa.chunked_array([["2026-11-29T24:00:00.000000+00:00"]]))
    assert not _writer_times(pa.chunked_array([["2026-11-29T10:00:00.000000+01:00"]]))


def test_blocks_parsed_on_worker_threads_are_stored_in_file_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many small blocks in flight at once, bad and over-long lines among them: the same answer as line by line."""
    import metrics_core.read.line_follower as lines_module

    monkeypatch.setattr(lines_module, "READ_CHUNK", 48 << 10)
    pieces = []
    for step in range(1, 3001):
        pieces.append(line(base_record(step, session=f"s{step // 700}", train_loss=1.0 / step)))
        if step % 401 == 0:
            pieces.append(HOSTILE["NaN literal"] if step % 2 else HOSTILE["two records on one line, then a blank line"])
        if step % 997 == 0:
            pieces.append(line(base_record(step, note="x" * 30_000)))  # longer than the record limit below
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"".join(pieces))
    exact = RunReader(path, bulk_threshold=PER_LINE, max_record_bytes=20_000)
    exact.refresh()
    bulk = RunReader(path, bulk_threshold=16 << 10, max_record_bytes=20_000)
    bulk.refresh()
    assert bulk.records == 3000 and bulk.bad_lines == 7 + 3
    assert snapshot(bulk) == snapshot(exact)
