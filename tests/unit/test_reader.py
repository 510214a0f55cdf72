"""RunReader: incremental tailing, torn tails, bad lines, typing, resets, sessions and effective history."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from metrics_core import MetricsWriter, RunContext, RunNotFoundError, TrainingState
from metrics_core.read.run_reader import RunReader
from tests.support import append_bytes, append_records, base_record, three_session_run
from tests.support.reading import CountingFile


def test_reads_only_appended_records_between_refreshes(metrics: Path) -> None:
    """Each refresh returns the count of new records only, and frames grow accordingly."""
    append_records(metrics, base_record(1, train_loss=3.0), base_record(2, train_loss=2.5))
    reader = RunReader(metrics.parent)
    assert reader.refresh() == 2
    assert reader.refresh() == 0
    append_records(metrics, base_record(3, train_loss=2.0))
    assert reader.refresh() == 1
    assert reader.frame("train")["train_loss"].tolist() == [3.0, 2.5, 2.0]


def test_reader_accepts_the_file_itself(metrics: Path) -> None:
    """RunReader takes the run directory or the metrics file."""
    append_records(metrics, base_record(1))
    reader = RunReader(metrics)
    assert reader.refresh() == 1


def test_missing_run_is_a_clear_error(tmp_path: Path) -> None:
    """A path that does not exist raises RunNotFoundError naming it."""
    with pytest.raises(RunNotFoundError, match="nope"):
        RunReader(tmp_path / "nope")


def test_directory_without_file_yet_reads_nothing_until_it_appears(tmp_path: Path) -> None:
    """A run directory whose trainer has not written yet is empty, then fills."""
    (tmp_path / "run").mkdir()
    reader = RunReader(tmp_path / "run")
    assert reader.refresh() == 0 and reader.sessions == []
    append_records(tmp_path / "run" / "metrics.jsonl", base_record(1))
    assert reader.refresh() == 1


@pytest.mark.parametrize(
    "tail",
    [b'{"schema_version":1,"ev', orjson.dumps(base_record(3)), b"\xff\xfe", b"   "],
    ids=["torn", "json", "bin", "ws"],
)
def test_incomplete_last_line_is_pending_until_its_newline(metrics: Path, tail: bytes) -> None:
    """Bytes after the last newline are never a record, even if they parse as JSON."""
    append_records(metrics, base_record(1), base_record(2))
    append_bytes(metrics, tail)
    reader = RunReader(metrics)
    assert reader.refresh() == 2
    assert reader.pending_bytes == len(tail)
    assert reader.frame("train")["step"].tolist() == [1, 2]
    assert reader.bad_lines == 0


def test_pending_line_becomes_a_record_once_completed(metrics: Path) -> None:
    """A line written in two parts appears exactly once, when its newline lands."""
    line = orjson.dumps(base_record(2, train_loss=1.5)) + b"\n"
    append_records(metrics, base_record(1, train_loss=2.0))
    append_bytes(metrics, line[:25])
    reader = RunReader(metrics)
    assert reader.refresh() == 1
    append_bytes(metrics, line[25:])
    assert reader.refresh() == 1
    assert reader.pending_bytes == 0
    assert reader.frame("train")["train_loss"].tolist() == [2.0, 1.5]


CORRUPT = [
    (b'{"schema_version":1,"time":"2026-', "invalid JSON"),
    (b"[1, 2, 3]", "not a JSON object"),
    (b"42", "not a JSON object"),
    (b'{"a": "\xff\xfe"}', "invalid JSON"),
    (orjson.dumps({k: v for k, v in base_record(5).items() if k != "step"}), "missing base field 'step'"),
    (orjson.dumps(base_record(5) | {"step": "5"}), "base field 'step'"),
    (orjson.dumps(base_record(5) | {"time": "yesterday"}), "not ISO-8601"),
]


@pytest.mark.parametrize("bulk_threshold", [0, 1 << 40], ids=["pyarrow", "per-line"])
def test_corrupt_middle_lines_are_counted_located_and_skipped(metrics: Path, bulk_threshold: int) -> None:
    """Every kind of bad complete line is skipped with its line number and reason; good ones survive."""
    good = [base_record(i, train_loss=1.0 / (i + 1)) for i in range(len(CORRUPT) + 1)]
    data = b""
    for record, (bad, _) in zip(good, CORRUPT, strict=False):
        data += orjson.dumps(record) + b"\n" + bad + b"\n"
    data += orjson.dumps(good[-1]) + b"\n\n  \n"
    append_bytes(metrics, data)
    reader = RunReader(metrics, bulk_threshold=bulk_threshold)
    assert reader.refresh() == len(good)
    assert reader.bad_lines == len(CORRUPT)
    assert [sample.line for sample in reader.bad_line_samples] == list(range(2, 2 * len(CORRUPT) + 1, 2))
    for sample, (_, reason) in zip(reader.bad_line_samples, CORRUPT, strict=True):
        assert reason in sample.reason
    assert reader.frame("train")["step"].tolist() == list(range(len(good)))


@pytest.mark.parametrize("bulk_threshold", [0, 1 << 40], ids=["pyarrow", "per-line"])
def test_lines_up_to_the_record_limit_are_read_and_longer_ones_are_bad(metrics: Path, bulk_threshold: int) -> None:
    """A line just under max_record_bytes is a record; a longer one, valid JSON or not, is one bad line."""
    limit = 64 << 10
    fits = base_record(1, note="")
    fits["note"] = "x" * (limit - len(orjson.dumps(fits)))
    too_long = base_record(2, note="y" * limit)
    append_records(metrics, fits, too_long)
    append_bytes(metrics, b'{"junk": "' + b"z" * (3 * limit) + b"\n")
    append_records(metrics, base_record(3))
    reader = RunReader(metrics, bulk_threshold=bulk_threshold, max_record_bytes=limit)
    assert reader.refresh() == 2
    assert list(reader.frame("train")["step"]) == [1, 3]
    assert len(reader.frame("train")["note"][0]) == len(fits["note"])
    assert [(bad.line, bad.reason.split(" is ")[0]) for bad in reader.bad_line_samples] == [
        (2, f"line of {len(orjson.dumps(too_long)):,} bytes"),
        (3, f"line of {3 * limit + 10:,} bytes"),
    ]
    assert reader.bad_line_samples[1].excerpt == '{"junk": "' + "z" * 70 + "…"


def test_the_default_record_limit_is_one_mebibyte(metrics: Path) -> None:
    """The documented default: 1 MiB lines are records, 1 MiB + 1 are not."""
    record = base_record(1, note="")
    record["note"] = "x" * ((1 << 20) - len(orjson.dumps(record)))
    append_records(metrics, record, {**record, "note": record["note"] + "x", "step": 2})
    reader = RunReader(metrics)
    assert reader.refresh() == 1 and reader.bad_lines == 1


def test_a_huge_pending_line_is_scanned_once_and_never_held(metrics: Path) -> None:
    """A 40 MB line still being written costs a scan of its new bytes per refresh, not a re-read from its start."""
    append_records(metrics, base_record(1))
    reader = RunReader(metrics)
    reader.refresh()
    reads: list[int] = []
    original = os.pread

    def counting_pread(fd: int, count: int, offset: int) -> bytes:
        data = original(fd, count, offset)
        reads.append(len(data))
        return data

    os.pread = counting_pread
    try:
        for _ in range(4):
            append_bytes(metrics, b'{"a": "' + b"q" * (10 << 20))
            reader.refresh()
        append_bytes(metrics, b'"}\n')
        append_records(metrics, base_record(2))
        assert reader.refresh() == 1
    finally:
        os.pread = original
    assert sum(reads) < (40 << 20) + (2 << 20), f"read {sum(reads):,} bytes for a 40 MB line"
    assert reader.bad_lines == 1 and "longer than" in reader.bad_line_samples[0].reason
    assert list(reader.frame("train")["step"]) == [1, 2]


@pytest.mark.parametrize("bulk_threshold", [0, 1 << 40], ids=["pyarrow", "per-line"])
def test_int_float_mixing_and_late_fields_stay_numeric(metrics: Path, bulk_threshold: int) -> None:
    """A field written as int then float is one float column; a field appearing late is missing before."""
    append_records(
        metrics,
        base_record(1, train_loss=3, lr=0),
        base_record(2, train_loss=2.5, lr=1e-4),
        base_record(3, train_loss=2, lr=2e-4, grad_norm_avg=None),
        base_record(4, train_loss=1.5, lr=3e-4, grad_norm_avg=0.7, status="ok"),
    )
    reader = RunReader(metrics, bulk_threshold=bulk_threshold)
    reader.refresh()
    frame = reader.frame("train")
    assert frame["train_loss"].dtype == np.float64 and frame["lr"].dtype == np.float64
    assert frame["train_loss"].tolist() == [3.0, 2.5, 2.0, 1.5]
    assert frame["grad_norm_avg"].isna().tolist() == [True, True, True, False]
    assert frame["status"].isna().tolist() == [True, True, True, False]
    assert str(frame["time"].dtype) == "datetime64[ns, UTC]"
    assert frame["time"][0] == pd.Timestamp("2026-11-29T10:00:01", tz="UTC")
    assert frame["step"].dtype == np.int64
    assert isinstance(frame["session_id"].dtype, pd.CategoricalDtype)


def test_type_changes_across_refreshes_widen_the_column(metrics: Path) -> None:
    """int then float across refreshes becomes float; a str among numbers keeps every value."""
    reader = RunReader(metrics.parent if metrics.parent.exists() else _mk(metrics))
    append_records(metrics, base_record(1, tokens=100, odd=1))
    reader.refresh()
    append_records(metrics, base_record(2, tokens=150.5, odd="text"))
    reader.refresh()
    frame = reader.frame("train")
    assert frame["tokens"].tolist() == [100.0, 150.5]
    assert frame["odd"].tolist() == [1, "text"]


def _mk(metrics: Path) -> Path:
    metrics.parent.mkdir(parents=True)
    return metrics.parent


def test_frame_of_unknown_event_is_empty_with_base_columns(metrics: Path) -> None:
    """Asking for an event never logged gives an empty frame, not an error."""
    append_records(metrics, base_record(1))
    reader = RunReader(metrics)
    reader.refresh()
    frame = reader.frame("validation")
    assert frame.empty and "step" in frame.columns


def test_newer_schema_version_is_read_and_reported(metrics: Path) -> None:
    """schema_version 2 records are kept, and the versions seen are counted."""
    append_records(metrics, base_record(1), base_record(2) | {"schema_version": 2, "new_field": 1})
    reader = RunReader(metrics)
    assert reader.refresh() == 2
    assert reader.schema_versions == {1: 1, 2: 1}


def test_truncated_file_is_reread_and_reset_reported(metrics: Path) -> None:
    """A file that shrank under the reader is read again from the start."""
    append_records(metrics, *(base_record(i) for i in range(5)))
    reader = RunReader(metrics)
    reader.refresh()
    metrics.write_bytes(b"")
    append_records(metrics, base_record(100))
    assert reader.refresh() == 1
    assert reader.resets == 1 and "shrank" in reader.reset_reasons[0]
    assert reader.frame("train")["step"].tolist() == [100]


def test_replaced_file_is_reread_and_reset_reported(metrics: Path) -> None:
    """A new inode at the same path (rotate, rsync) restarts the reader."""
    append_records(metrics, *(base_record(i) for i in range(3)))
    reader = RunReader(metrics)
    reader.refresh()
    replacement = metrics.with_name("new.jsonl")
    append_records(replacement, *(base_record(i) for i in range(10, 20)))
    os.replace(replacement, metrics)
    assert reader.refresh() == 10
    assert reader.resets == 1 and "replaced" in reader.reset_reasons[0]
    assert reader.frame("train")["step"].tolist() == list(range(10, 20))


def test_rewritten_file_of_larger_size_is_detected(metrics: Path) -> None:
    """Same inode, rewritten in place and longer: the changed bytes before the offset are noticed."""
    append_records(metrics, *(base_record(i) for i in range(3)))
    reader = RunReader(metrics)
    reader.refresh()
    with open(metrics, "r+b") as out:
        out.truncate(0)
        out.write(b"".join(orjson.dumps(base_record(i, session="other")) + b"\n" for i in range(50, 60)))
    assert reader.refresh() == 10
    assert reader.resets == 1
    assert reader.frame("train")["step"].tolist() == list(range(50, 60))


def test_a_rewrite_of_the_last_line_read_is_noticed_in_the_read_that_takes_the_new_bytes(metrics: Path) -> None:
    """Same inode and first line, the last line handed out changed and new lines after it: the
    check of that line, made in the same read as the new bytes, starts the reader over."""
    append_records(metrics, *(base_record(i) for i in range(3)))
    reader = RunReader(metrics)
    reader.refresh()
    kept = b"".join(metrics.read_bytes().splitlines(keepends=True)[:2])
    with open(metrics, "r+b") as out:  # the same length up to the last line's end, then longer
        out.seek(len(kept))
        out.write(b"".join(orjson.dumps(base_record(step)) + b"\n" for step in (7, 8)))
    assert reader.refresh() == 4
    assert reader.resets == 1 and "rewritten" in reader.reset_reasons[0]
    assert reader.frame("train")["step"].tolist() == [0, 1, 7, 8]
    append_records(metrics, base_record(9))  # and an append after it is read as one
    assert reader.refresh() == 1 and reader.resets == 1


@pytest.mark.parametrize("bulk_threshold", [0, 1 << 40], ids=["pyarrow", "per-line"])
def test_three_sessions_effective_history(metrics: Path, bulk_threshold: int) -> None:
    """Records of earlier sessions at or beyond a later session's first step are superseded."""
    three_session_run(metrics)
    reader = RunReader(metrics, bulk_threshold=bulk_threshold)
    reader.refresh()
    effective = reader.effective("train")
    assert effective["step"].tolist() == list(range(10, 201, 10))
    assert effective["session_id"].tolist() == ["s1"] * 6 + ["s2"] * 6 + ["s3"] * 8
    assert len(reader.frame("train")) == 10 + 9 + 8
    assert reader.effective("validation")["step"].tolist() == [50, 100, 150, 200]
    assert reader.effective("validation")["session_id"].tolist() == ["s1", "s2", "s3", "s3"]


def test_a_session_that_relogs_its_first_step_supersedes_that_step(metrics: Path) -> None:
    """When the later session logs the same event at its first step, the earlier record at that step goes."""
    append_records(metrics, *(base_record(s, session="a", train_loss=1.0) for s in range(1, 11)))
    append_records(metrics, *(base_record(s, session="b", train_loss=2.0) for s in range(6, 13)))
    reader = RunReader(metrics)
    reader.refresh()
    effective = reader.effective("train")
    assert effective["step"].tolist() == list(range(1, 13))
    assert effective["session_id"].tolist() == ["a"] * 5 + ["b"] * 7
    assert reader.sessions[1].steps_replayed == 4 and reader.sessions[1].records_superseded == 5


def test_sessions_carry_resume_and_replay_accounting(metrics: Path) -> None:
    """Each session reports its steps, replayed work, downtime and what its session_start said."""
    three_session_run(metrics)
    reader = RunReader(metrics)
    reader.refresh()
    s1, s2, s3 = reader.sessions
    assert [s.index for s in (s1, s2, s3)] == [0, 1, 2]
    assert (s1.first_step, s1.last_step, s1.records, s1.steps_replayed) == (0, 100, 1 + 10 + 2, 0)
    assert (s2.resume_step, s2.last_step, s2.resumed_from_step, s2.discarded_bytes) == (60, 150, 60, 17)
    # s2 resumed from the step-60 checkpoint: s1's windows 70..100 and validation at 100 were redone.
    assert (s2.steps_replayed, s2.tokens_replayed, s2.records_superseded) == (40, 4000, 4 + 1)
    assert (s3.steps_replayed, s3.tokens_replayed, s3.records_superseded) == (30, 3000, 3 + 1)
    assert s1.downtime_s is None
    assert s2.downtime_s == (s2.start_time - s1.end_time).total_seconds()
    assert s1.discarded_bytes == 0 and s1.resumed_from_step is None
    assert s3.end_time.tzinfo is not None


def test_session_end_status_is_kept(metrics: Path) -> None:
    """The status of a session_end record lands on its session."""
    append_records(
        metrics, base_record(0, event="session_start"), base_record(10, event="session_end", status="failed")
    )
    reader = RunReader(metrics)
    reader.refresh()
    assert reader.sessions[0].end_status == "failed"
    assert reader.last_event == "session_end"


def test_pyarrow_and_per_line_parsers_agree(tmp_path: Path) -> None:
    """The bulk parser and the exact parser produce identical frames and sessions."""
    from metrics_core.testing.generate import write_run

    path = tmp_path / "big" / "metrics.jsonl"
    write_run(path, 5000)
    bulk, exact = RunReader(path, bulk_threshold=0), RunReader(path, bulk_threshold=1 << 40)
    assert bulk.refresh() == exact.refresh() > 4900
    for event in ("session_start", "train", "validation", "checkpoint"):
        pd.testing.assert_frame_equal(bulk.frame(event), exact.frame(event))
        pd.testing.assert_frame_equal(bulk.effective(event), exact.effective(event))
    assert bulk.sessions == exact.sessions


def test_records_from_the_real_writer_read_back(tmp_path: Path) -> None:
    """What MetricsWriter writes, RunReader reads with the same values and UTC times."""
    state = TrainingState(step=5, tokens_seen=500)
    with MetricsWriter(RunContext(tmp_path / "w", "w", "s")) as writer:
        written = writer.write("train", state, train_loss=1.25, grad_norm_avg=None)
        writer.write("train", state, train_loss=1.0, grad_norm_avg=0.5)
    reader = RunReader(tmp_path / "w")
    reader.refresh()
    row = reader.frame("train").iloc[0]
    assert row["train_loss"] == 1.25 and np.isnan(row["grad_norm_avg"])
    assert row["time"] == pd.Timestamp(written["time"])


@pytest.mark.parametrize("bulk_threshold", [0, 1 << 40], ids=["pyarrow", "per-line"])
def test_a_field_that_never_held_a_value_is_not_a_column(metrics: Path, bulk_threshold: int) -> None:
    """null and absent are one thing in JSON lines: a field null so far has no column until its first value."""
    append_records(metrics, base_record(1, grad_norm_avg=None), base_record(2))
    reader = RunReader(metrics, bulk_threshold=bulk_threshold)
    reader.refresh()
    assert "grad_norm_avg" not in reader.frame("train")
    append_records(metrics, base_record(3, grad_norm_avg=0.5))
    reader.refresh()
    assert reader.frame("train")["grad_norm_avg"].tolist()[:2] == [pytest.approx(np.nan, nan_ok=True)] * 2
    assert reader.frame("train")["grad_norm_avg"].tolist()[2] == 0.5


def test_memory_is_columnar(tmp_path: Path) -> None:
    """A realistic train record is held in well under 150 bytes of column data."""
    from metrics_core.testing.generate import write_run

    path = tmp_path / "m" / "metrics.jsonl"
    count = write_run(path, 20_000)
    reader = RunReader(path)
    reader.refresh()
    assert reader.resident_bytes() / count < 150


def test_a_cold_load_reads_each_byte_once_and_a_small_refresh_starts_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of a cold load are read once (a block's torn last line is read with the next), threads only for bulk."""
    import metrics_core.read.arrow_records as arrow_module
    import metrics_core.read.line_follower as lines_module
    from metrics_core.testing.generate import record, write_run

    monkeypatch.setattr(lines_module, "READ_CHUNK", 2 << 20)  # five blocks, each for pyarrow
    pools: list[int] = []

    class CountingPool(arrow_module.ThreadPoolExecutor):
        def __init__(self, *args: object, **kwargs: object) -> None:
            pools.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(arrow_module, "ThreadPoolExecutor", CountingPool)
    path = tmp_path / "run" / "metrics.jsonl"
    count = write_run(path, 20_000)
    file = CountingFile(path)
    reader = RunReader(path, file=file)
    assert reader.refresh() == count
    assert path.stat().st_size <= file.bytes_read <= path.stat().st_size + 64 * 1024
    assert len(pools) == 1
    append_bytes(path, b"".join(record("s", "train", 10**9 + i, 0, 0, 10**18) for i in range(10)))
    assert reader.refresh() == 10 and len(pools) == 1


def test_a_record_limit_below_pyarrows_line_limit_is_applied_on_the_bulk_path_too(metrics: Path) -> None:
    """With max_record_bytes=1000, a 2 KB line among short ones is one bad line whichever parser reads it."""
    append_records(metrics, *(base_record(step) for step in range(1, 21)))
    append_records(metrics, base_record(21, note="n" * 2000))
    append_records(metrics, *(base_record(step) for step in range(22, 41)))
    answers = []
    for bulk_threshold in (0, 1 << 40):
        reader = RunReader(metrics, bulk_threshold=bulk_threshold, max_record_bytes=1000)
        assert reader.refresh() == 39
        answers.append([(bad.line, bad.reason) for bad in reader.bad_line_samples])
    assert answers[0] == answers[1] and answers[0][0][0] == 21


def test_a_value_shared_by_two_events_is_typed_per_event_on_both_paths(metrics: Path) -> None:
    """``0`` in validation next to ``0.5`` in train: an int in validation whichever parser reads the block."""
    append_records(metrics, base_record(1, train_loss=0.5), base_record(1, event="validation", train_loss=0))
    for bulk_threshold in (0, 1 << 40):
        reader = RunReader(metrics, bulk_threshold=bulk_threshold)
        reader.refresh()
        assert reader.frame("validation")["train_loss"].dtype == np.int64
        assert reader.frame("train")["train_loss"].dtype == np.float64
