"""metrics_core.read.run_digest, the orjson-only read behind the terminal tools, against RunReader on real files."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.generate import write_run
from metrics_core.cli.main import summary_lines
from metrics_core.read.run_digest import RunDigest, batches, follow_file, last_records
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import run_status
from metrics_core.read.run_summary import summarise
from metrics_core.read.session_model import Session
from metrics_core.text import clean, fit, fit_middle, width
from tests.support import append_bytes, append_records, base_record, three_session_run

SESSION_FIELDS = (
    "session_id", "index", "first_step", "last_step", "records", "downtime_s", "steps_replayed", "tokens_replayed",
    "tokens_replayed_is_upper_bound", "records_superseded", "discarded_bytes", "resumed_from_step", "end_status",
)  # fmt: skip


def assert_replay_matches_the_masks(reader: RunReader) -> None:
    """The O(rows) oracle of ``session_log.replay``: each session's share of earlier records, from the
    reader's per-row ``replaced_by`` masks, and the superseded training time from its frame."""
    sessions = reader.sessions
    for session in sessions[1:]:
        masks = {event: reader.replaced_by(session.index, event) for event in reader.events}
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


def test_realistic_resumed_run_agrees_with_run_reader(tmp_path: Path) -> None:
    """The benchmark generator's three overlapping sessions, a bad line and a torn tail: same numbers."""
    path = tmp_path / "r" / "metrics.jsonl"
    write_run(path, 6000)
    append_bytes(path, b"not json\n" + b'{"schema_version":1,"ti')
    digest = assert_agrees_with_reader(path, datetime.now(timezone.utc))
    assert [s.steps_replayed for s in digest.sessions][1:] == [800, 800]
    assert digest.bad_lines == 1 and digest.pending_bytes == 23


def test_three_session_run_replay_counts(tmp_path: Path) -> None:
    """s2 redoes 60..100 of s1, s3 redoes 120..150 of s2: 70 steps and 7,000 tokens, as the reader says."""
    path = tmp_path / "metrics.jsonl"
    three_session_run(path)
    digest = assert_agrees_with_reader(path, datetime.now(timezone.utc))
    assert [(s.steps_replayed, s.tokens_replayed) for s in digest.sessions] == [(0, 0), (40, 4000), (30, 3000)]


def nanogpt_resume(path: Path, *, restored_tokens: bool) -> None:
    """Windows of 5 steps of 1,024 tokens to step 45, a crash, a resume from the step-24 checkpoint,
    which lies inside the window logged at step 25 (20..25)."""

    def window(step: int, session: str, offset: int = 0) -> dict:
        return base_record(step, session=session, tokens=5 * 1024, tokens_seen=step * 1024 - offset)

    append_records(path, base_record(0, event="session_start", session="s1", tokens_seen=0))
    append_records(path, *(window(step, "s1") for step in range(5, 46, 5)))
    offset = 0 if restored_tokens else 24 * 1024  # a trainer that restarts its token counter at 0
    append_records(path, base_record(24, event="session_start", session="s2", tokens_seen=24 * 1024 - offset,
                                     resumed_from_step=24))  # fmt: skip
    append_records(path, *(window(step, "s2", offset) for step in range(29, 60, 5)))


def test_a_resume_inside_a_log_window_counts_only_the_tokens_after_it(tmp_path: Path) -> None:
    """Resume at 24 inside the 20..25 window: 21 steps and 21,504 tokens redone, not the whole windows' 25,600."""
    path = tmp_path / "metrics.jsonl"
    nanogpt_resume(path, restored_tokens=True)
    digest = assert_agrees_with_reader(path, datetime.now(timezone.utc))
    resumed = digest.sessions[1]
    assert (resumed.steps_replayed, resumed.tokens_replayed, resumed.tokens_replayed_is_upper_bound) == (
        21, 21 * 1024, False)  # fmt: skip
    lost = digest.lost_work()
    assert (lost.tokens_replayed, lost.tokens_replayed_is_upper_bound) == (21_504, False)
    assert "21 steps and 21,504 tokens replayed" in "\n".join(summary_lines(digest, now=datetime.now(timezone.utc)))


def test_a_resume_the_counters_cannot_place_is_reported_as_an_upper_bound(tmp_path: Path) -> None:
    """The resumed tokens_seen restarts at 0: where step 24 fell in its window is unknown, so 25,600 is shown as ≤."""
    path = tmp_path / "metrics.jsonl"
    nanogpt_resume(path, restored_tokens=False)
    digest = assert_agrees_with_reader(path, datetime.now(timezone.utc))
    resumed = digest.sessions[1]
    assert (resumed.tokens_replayed, resumed.tokens_replayed_is_upper_bound) == (25_600, True)
    assert "21 steps and ≤ 25,600 tokens replayed" in "\n".join(summary_lines(digest, now=datetime.now(timezone.utc)))


@st.composite
def resumed_runs(draw: st.DrawFn) -> list[dict]:
    """Sessions resuming at arbitrary steps, relogging (or not) their first step, some interleaved."""
    records, clock = [], 0
    for session in range(draw(st.integers(1, 5))):
        step = draw(st.integers(0, 60))
        for _ in range(draw(st.integers(1, 8))):
            event = draw(st.sampled_from(["train", "train", "validation", "session_start", "session_end"]))
            clock += draw(st.integers(0, 3))
            tokens = draw(st.one_of(st.integers(0, 500), st.none(), st.just("many"), st.booleans()))
            record = base_record(step, event=event, session=f"s{draw(st.sampled_from([session, session, 0]))}",
                                 tokens=tokens, status=draw(st.sampled_from(["finished", "failed", 3])),
                                 discarded_bytes=draw(st.sampled_from([0, 17, None, 2.5])))  # fmt: skip
            record["time"] = (datetime(2026, 11, 29, tzinfo=timezone.utc) + timedelta(seconds=clock)).isoformat()
            records.append(record)
            step += draw(st.integers(-5, 20))
    return records


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=resumed_runs())
def test_any_resume_layout_agrees_with_run_reader(tmp_path: Path, records: list[dict]) -> None:
    """Supersession, replay and lost work equal RunReader's for resumes at any step, steps going back, interleaving."""
    path = tmp_path / "fuzz" / "metrics.jsonl"
    path.unlink(missing_ok=True)
    append_records(path, *records)
    assert_agrees_with_reader(path, datetime(2026, 11, 29, 0, 5, tzinfo=timezone.utc))


def tail_file(path: Path) -> list[bytes]:
    """Complete lines of a file with bad, blank and overlong lines and a torn tail."""
    lines = []
    for step in range(1, 120):
        record = base_record(step, event="validation" if step % 7 == 0 else "train", session=f"s{step // 50}")
        lines.append(orjson.dumps(record))
        if step % 13 == 0:
            lines.append(b"{broken" if step % 2 else b"")
        if step % 31 == 0:
            lines.append(b'{"pad":"' + b"x" * 3000 + b'"}')
    append_bytes(path, b"".join(line + b"\n" for line in lines) + b'{"torn')
    return lines


@pytest.mark.parametrize("chunk", [64, 1000, 1 << 16])
def test_last_records_equals_the_end_of_a_forward_read(tmp_path: Path, chunk: int) -> None:
    """For every N, reading backwards gives the last N records and the same bad lines as a forward read."""
    path = tmp_path / "metrics.jsonl"
    tail_file(path)
    follower = follow_file(path, max_record_bytes=2000)
    read = list(batches(follower))
    records = [r for batch in read for r in batch.records]
    skipped = [s for batch in read for s in batch.skipped]
    for count in (0, 1, 5, 40, len(records), len(records) + 10):
        answer = last_records(path, count, keep=lambda r: True, max_record_bytes=2000, chunk=chunk)
        assert answer.records == records[max(0, len(records) - count) :]
        assert answer.end == follower.offset
        first = answer.records[0]["time"] if answer.records else None
        expected = [s for s in skipped if first is not None and s.offset > _offset_of(path, first)]
        assert [(s.offset, s.reason) for s in answer.skipped] == [(s.offset, s.reason) for s in expected]
        if count >= len(records):
            assert [s.line for s in answer.skipped] == [s.line for s in skipped]
    validation = last_records(path, 3, keep=lambda r: r["event"] == "validation", chunk=chunk)
    assert [r["step"] for r in validation.records] == [105, 112, 119]


def _offset_of(path: Path, time_ns: int) -> int:
    """Byte offset of the first line holding a record with this time (test helper)."""
    stamp = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=time_ns // 1000)
    needle = stamp.strftime("%Y-%m-%dT%H:%M:%S").encode()
    return path.read_bytes().index(needle)


def test_last_records_finds_the_predecessor_for_the_first_rate(tmp_path: Path) -> None:
    """The earlier train record of the first printed one's session is returned as context, not printed."""
    path = tmp_path / "metrics.jsonl"
    append_records(path, *(base_record(s) for s in range(1, 6)), base_record(5, event="validation"))
    answer = last_records(path, 1, keep=lambda r: r["event"] == "validation")
    assert [r["step"] for r in answer.records] == [5] and answer.context == []
    answer = last_records(path, 2, keep=lambda r: r["event"] == "train")
    assert [r["step"] for r in answer.records] == [4, 5] and [r["step"] for r in answer.context] == [3]


def test_follower_waits_for_the_newline_and_notices_a_rewrite(tmp_path: Path) -> None:
    """A torn line is handed out once complete; a shrunk or replaced file is read again from its start."""
    path = tmp_path / "metrics.jsonl"
    append_records(path, base_record(1))
    follower = follow_file(path)
    assert [r["step"] for b in batches(follower) for r in b.records] == [1]
    line = orjson.dumps(base_record(2)) + b"\n"
    append_bytes(path, line[:20])
    assert [r for b in batches(follower) for r in b.records] == [] and follower.pending_bytes == 20
    append_bytes(path, line[20:])
    assert [r["step"] for b in batches(follower) for r in b.records] == [2]
    path.write_bytes(orjson.dumps(base_record(7)) + b"\n")  # cut and rewritten in place
    read = list(batches(follower))
    assert read[0].reset is not None and "shrank" in read[0].reset
    assert [r["step"] for b in read for r in b.records] == [7]
    replacement = tmp_path / "new"
    replacement.write_bytes(orjson.dumps(base_record(9)) + b"\n")
    os.replace(replacement, path)
    read = list(batches(follower))
    assert "replaced" in read[0].reset and [r["step"] for b in read for r in b.records] == [9]


def test_follower_skips_an_overlong_line_by_its_length(tmp_path: Path) -> None:
    """A line beyond the record limit is one bad line with its line number; the records around it stay."""
    path = tmp_path / "metrics.jsonl"
    append_records(path, base_record(1))
    append_bytes(path, b"x" * 5000 + b"\n")
    append_records(path, base_record(2))
    read = list(batches(follow_file(path, max_record_bytes=1000)))
    assert [r["step"] for b in read for r in b.records] == [1, 2]
    assert [(s.line, s.where) for b in read for s in b.skipped] == [(2, "line 2")]


def test_follower_reads_each_byte_about_once_across_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small blocks ending mid-line, and an over-long line longer than several blocks: the records a
    single read gives, with each byte read about once (the cut line's tail is read again, not the
    whole next block)."""
    import metrics_core.read.line_follower as lines_module

    path = tmp_path / "metrics.jsonl"
    pieces = [orjson.dumps(base_record(step, note="n" * (step % 97))) + b"\n" for step in range(1, 1201)]
    pieces.insert(600, b"x" * 100_000 + b"\n")  # beyond the record limit and REREAD_BYTES: skipped over
    path.write_bytes(b"".join(pieces))
    whole = [(r["step"], r["note"]) for b in batches(follow_file(path, max_record_bytes=2000)) for r in b.records]
    read = []
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, count, offset: read.append(count) or pread(fd, count, offset))
    monkeypatch.setattr(lines_module, "READ_CHUNK", 4096)
    read_batches = list(batches(follow_file(path, max_record_bytes=2000)))
    assert (
        [(r["step"], r["note"]) for b in read_batches for r in b.records]
        == whole
        == [(step, "n" * (step % 97)) for step in range(1, 1201)]
    )
    assert [s.line for b in read_batches for s in b.skipped] == [601]
    assert len(read_batches) > 50 and sum(read) < 1.2 * path.stat().st_size  # was 2x: every block read twice


def test_hostile_text_is_cleaned_and_fitted() -> None:
    """Escape sequences, controls and bidi overrides go; wide characters count two columns."""
    hostile = "s\x1b[2J\x1b[31mred\x1b]0;title\x07\u202eevil\r\n\t\x9b1Aend"
    assert clean(hostile) == "sredevilend"
    assert width("日本") == 4 and width(fit("日本語のセッション", 7)) <= 7
    assert fit_middle("20251129T000000Z-gpu-node-017-pid40000", 16) == "20251129…id40000"
    assert fit("abc", 3) == "abc" and fit("abcd", 3) == "ab…"
