"""metrics_core.read.run_digest, the orjson-only read behind the terminal tools, against RunReader on real files."""

from __future__ import annotations

import io
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import orjson
import pytest

from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.cli.main import main
from metrics_core.cli.summary import summary_lines
from metrics_core.read.run_digest import batches, follow_file, last_records
from metrics_core.read.session_order import session_order
from metrics_core.testing.generate import write_run
from metrics_core.text import clean, fit, fit_middle, width
from tests.support import append_bytes, append_records, base_record, eight_sessions, read_run, three_session_run
from tests.support.reading import (
    assert_agrees_with_reader,
)


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


def resumed_by_the_writer(directory: Path) -> list[str]:
    """Three sessions written by MetricsWriter, 1,500 windows each (~300 KB, many probe reads), the
    second and third resumed from a checkpoint before the previous one's last step; their ids."""
    ids = ["7f3a9c1e-first", "0b44d2aa-second", "c9e1f07d-third"]
    state = TrainingState()
    for number, session in enumerate(ids):
        state.step = number * 1000
        with MetricsWriter(RunContext(directory, "resumed", session)) as writer:
            writer.write("session_start", state, discarded_bytes=0, resumed_from_step=state.step or None)
            for _ in range(1500):
                state.step += 1
                state.tokens_seen += 512
                writer.write("train", state, train_loss=1.0 / state.step, lr=3e-4, tokens=512)
    return ids


def test_tail_and_summary_name_the_sessions_s1_s2_s3_as_the_pages_do(tmp_path: Path) -> None:
    """tail -n N (read backwards, the sessions before found by bisection) names each line's session
    as tail -n +1 (counted forwards) and the pages do: S1, S2, S3, never the session id; summary too."""
    run = tmp_path / "resumed"
    ids = resumed_by_the_writer(run)

    def cli(*args: str) -> list[str]:
        out, err = io.StringIO(), io.StringIO()
        assert main([*args], out, err) == 0 and err.getvalue() == ""
        return out.getvalue().splitlines()

    forward = cli("tail", str(run), "-n", "+1")
    assert [line.split()[2] for line in forward] == ["S1"] * 1501 + ["S2"] * 1501 + ["S3"] * 1501
    for count in (1, 10, 1502, 3003):
        assert cli("tail", str(run), "-n", str(count)) == forward[-count:], count
    starts = cli("tail", str(run), "-n", "3", "--event", "session_start")
    assert [line.split()[2:4] for line in starts] == [["S1", "session_start"], ["S2", "session_start"],
                                                       ["S3", "session_start"]]  # fmt: skip
    assert not any(session[:8] in line for line in forward for session in ids)
    rows = [line.split()[0] for line in cli("summary", str(run)) if line[:2] in ("S1", "S2", "S3")]
    assert rows == ["S1", "S2", "S3"]


def test_session_order_finds_every_session_in_file_order(tmp_path: Path) -> None:
    """The bisection's sessions equal the reader's, in order: the generator's three overlapping
    sessions with a bad line and a torn tail, the eight-session run, and an empty file."""
    path = tmp_path / "r" / "metrics.jsonl"
    write_run(path, 6000)
    append_bytes(path, b"not json\n" + b'{"schema_version":1,"ti')
    end = path.stat().st_size - 23
    assert session_order(path, end=end) == [s.session_id for s in read_run(path).sessions]
    eight = tmp_path / "eight.jsonl"
    eight_sessions(eight)
    assert session_order(eight, end=eight.stat().st_size) == [s.session_id for s in read_run(eight).sessions]
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert session_order(tmp_path / "empty.jsonl", end=0) == []


def test_query_names_the_sessions_s1_s2_s3_beside_their_ids(tmp_path: Path) -> None:
    """The ``sessions`` view of ``query`` has each session's name as the pages and tail give it."""
    pytest.importorskip("pyarrow")
    from metrics_core.sql.export_table import run_facts
    from metrics_core.sql.query_views import sessions_view

    run = tmp_path / "resumed"
    ids = resumed_by_the_writer(run)
    view = sessions_view({"resumed": run_facts(read_run(run / "metrics.jsonl"))}).to_pydict()
    assert (view["session"], view["name"]) == (ids, ["S1", "S2", "S3"])
