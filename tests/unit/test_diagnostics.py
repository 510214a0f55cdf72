"""Replay accounting and loss-sanity diagnostics on crafted runs, read through the public reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from metrics_core import MetricsWriter, RunContext, TrainingState, TrainingWindow
from metrics_core.analysis.derived import replay_windows, session_table
from metrics_core.analysis.diagnostics import diagnose, diagnose_reader
from metrics_core.analysis.loss_checks import CHECKED_FIELDS, diagnose_from_scratch
from tests.support import append_bytes, append_records, base_record, read_run, three_session_run
from tests.support.reading import checks, window


def test_clean_run_from_the_real_writer_says_so_in_one_line(tmp_path: Path) -> None:
    """A run written through MetricsWriter and TrainingWindow passes every check."""
    state, win = TrainingState(), TrainingWindow()
    with MetricsWriter(RunContext(tmp_path / "r", "r", "s")) as writer:
        writer.write("session_start", state, discarded_bytes=0, resumed_from_step=None)
        for attempt in range(200):
            skipped = attempt % 37 == 0
            win.add(2.0 - attempt / 200, 800, 0.9, skipped, 1.0)
            state.tokens_seen += 800
            state.skipped_updates += skipped
            state.step += not skipped
            if win.attempts == 10:
                writer.write("train", state, **win.summary(1e-3))
                win.reset()
    (finding,) = diagnose_reader(read_run(tmp_path / "r"))
    assert finding.severity == "ok" and "20 train windows in 1 session" in finding.message


def test_tokens_counted_on_one_batch_of_eight_is_flagged(tmp_path: Path) -> None:
    """Windows whose tokens cover 1 of 8 batches are named with session, steps and count."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(window(s, tokens=1000 if 50 <= s <= 70 else 8000) for s in range(10, 201, 10)))
    found = checks(diagnose_reader(read_run(path)))
    subset = found["tokens per update"]
    assert (subset.session, subset.first_step, subset.last_step, subset.records) == ("s1", 50, 70, 3)
    assert "subset of batches" in subset.message
    mismatch = found["tokens_seen vs windows"]
    assert (mismatch.first_step, mismatch.last_step, mismatch.records) == (50, 70, 3)
    assert "ok" not in {f.severity for f in found.values()}


def test_short_windows_at_every_resume_do_not_cry_wolf(tmp_path: Path) -> None:
    """A loop logging every 5 iterations: each session's first window covers 1; tokens per update stay normal."""
    path = tmp_path / "r" / "metrics.jsonl"
    records, seen = [], 0
    for session, first in (("s1", 1), ("s2", 41), ("s3", 81)):
        for step in [first, *range(first + 4, first + 40, 5)]:
            attempts = 1 if step == first else 5
            seen += attempts * 800
            records.append(
                window(step, session, tokens=attempts * 800, seen=seen, attempted=attempts, updates=attempts)
            )
    append_records(path, *records)
    found = checks(diagnose_reader(read_run(path)))
    assert "tokens per update" not in found


def test_missing_counts_are_not_an_accounting_error(tmp_path: Path) -> None:
    """A window that did not log attempted_updates is not flagged as attempted ≠ updates + skipped."""
    path = tmp_path / "r" / "metrics.jsonl"
    records = [window(s) for s in range(10, 61, 10)]
    del records[2]["attempted_updates"]
    append_records(path, *records)
    assert "window accounting" not in checks(diagnose_reader(read_run(path)))


def test_window_accounting_and_counters_are_checked(tmp_path: Path) -> None:
    """attempted ≠ updates + skipped, a skipped counter that does not add up, steps going back."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(
        path,
        window(10), window(20, attempted=12, updates=10, skipped=1, cumulative_skipped=1),
        window(30, cumulative_skipped=5), window(25, seen=30 * 800 + 8000 - 5 * 800, attempted=-5, updates=-5,
                                                cumulative_skipped=5),
    )  # fmt: skip
    found = checks(diagnose_reader(read_run(path)))
    assert found["window accounting"].first_step == 20 and found["window accounting"].records == 1
    assert found["skipped_updates vs windows"].first_step == 30
    assert found["steps increasing"].first_step == 25
    assert found["window accounting"].severity == "error"


def test_loss_jump_at_resume_is_flagged(tmp_path: Path) -> None:
    """A resumed session whose redo of the same steps has a clearly different loss is named."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(window(s, loss=1.0) for s in range(10, 101, 10)))
    append_records(path, base_record(60, event="session_start", session="s2"),
                   *(window(s, "s2", loss=1.5) for s in range(70, 151, 10)))  # fmt: skip
    reader = read_run(path)
    jump = checks(diagnose_reader(reader))["loss jump at resume"]
    assert (jump.session, jump.first_step, jump.last_step, jump.records) == ("s2", 60, 100, 4)
    assert "+0.5" in jump.message
    (replay,) = replay_windows(reader.frame("train"), reader.sessions, reader.redone_by("train"))
    assert (replay.first_step, replay.last_step, replay.earlier_records, replay.redo_records) == (
        60,
        100,
        4,
        4,
    )
    assert replay.loss_delta == pytest.approx(0.5)


def test_matching_resume_and_tokens_per_step_change(tmp_path: Path) -> None:
    """A resume that reproduces the loss is not flagged; a changed batch size is."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(window(s) for s in range(10, 101, 10)))
    append_records(path, *(window(s, "s2", tokens=16000, seen=80_000 + (s - 100) * 1600) for s in range(110, 151, 10)))
    found = checks(diagnose_reader(read_run(path)))
    assert "loss jump at resume" not in found
    assert "16,000 tokens per step" not in found["tokens per step at resume"].message
    assert "1,600 tokens per step" in found["tokens per step at resume"].message


def test_ingest_health_findings(tmp_path: Path) -> None:
    """Bad lines (with line numbers), pending bytes and reader resets are reported."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, window(10), window(20))
    append_bytes(path, b"[1, 2]\n")
    append_records(path, window(30))
    reader = read_run(path)
    assert "line 3: not a JSON object" in checks(diagnose_reader(reader))["bad lines"].message
    append_bytes(path, b'{"x')
    reader.refresh()
    assert "3 byte(s)" in checks(diagnose_reader(reader))["torn tail"].message
    replacement = path.with_name("rotated")
    append_records(replacement, window(10))
    replacement.replace(path)
    reader.refresh()
    resets = checks(diagnose_reader(reader))["reader resets"]
    assert resets.severity == "warning" and "replaced" in resets.message


def test_schema_version_finding(tmp_path: Path) -> None:
    """Records of a newer schema are counted and reported."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, window(10), window(20) | {"schema_version": 2})
    assert checks(diagnose_reader(read_run(path)))["schema versions"].records == 1


def test_session_table_and_lost_work(tmp_path: Path) -> None:
    """The sessions table and the lost-work summary of a three-session run."""
    path = tmp_path / "r" / "metrics.jsonl"
    three_session_run(path)
    reader = read_run(path)
    table = session_table(reader.sessions, reader.frame("train"), "stalled")
    assert list(table["session"]) == [1, 2, 3]
    assert list(table["resume step"].fillna(-1)) == [-1, 60, 120]
    assert list(table["steps replayed"]) == [0, 40, 30]
    assert list(table["tokens replayed"]) == [0, 4000, 3000]
    assert list(table["end status"]) == ["crashed", "crashed", "stalled"]
    lost = reader.lost_work()
    assert (lost.steps_replayed, lost.tokens_replayed) == (70, 7000)
    assert lost.downtime_s == pytest.approx(sum(s.downtime_s or 0 for s in reader.sessions))
    assert lost.superseded_time_s == pytest.approx(70.0)  # 7 superseded windows, 10 s apart
    assert 0 < lost.superseded_share < 1
    assert np.isfinite(table["mean tokens/s"].astype(float)).all()
    assert str(table["resume step"].dtype) == "Int64"


def health(step: int, slowest: int, ratio: float, session: str = "s1") -> dict:
    """A clean data-parallel window whose slowest rank takes ``ratio`` x the fastest rank's time."""
    return window(step, session) | {"world_size": 4, "slowest_rank": slowest, "rank_step_time_min_s": 0.2,
                                    "rank_step_time_max_s": 0.2 * ratio, "rank_tokens_per_s_min": 1000.0,
                                    "rank_tokens_per_s_max": 1000.0 * ratio}  # fmt: skip


def test_persistently_slow_rank_is_named_with_its_ratio(tmp_path: Path) -> None:
    """Rank 3 slowest by 1.5x in 7 consecutive windows: one warning naming rank, steps and ratio."""
    path = tmp_path / "r" / "metrics.jsonl"
    ranks = [0, 1, 3, 3, 3, 3, 3, 3, 3, 2]
    append_records(path, *(health(10 * (i + 1), rank, 1.5 if rank == 3 else 1.05) for i, rank in enumerate(ranks)))
    found = [f for f in diagnose_reader(read_run(path)) if f.check == "straggler rank"]
    (straggler,) = found
    assert (straggler.severity, straggler.session, straggler.records) == ("warning", "s1", 7)
    assert (straggler.first_step, straggler.last_step) == (30, 90)
    assert "rank 3 was the slowest rank in 7 consecutive windows" in straggler.message
    assert "1.50×" in straggler.message


def test_short_streaks_small_ratios_and_rotating_ranks_are_not_stragglers(tmp_path: Path) -> None:
    """A 4-window streak, a 1.1x spread, or a different slowest rank each window is no finding."""
    path = tmp_path / "r" / "metrics.jsonl"
    records = [health(10 * (i + 1), 2, 2.0) for i in range(4)]  # too short
    records += [health(10 * (i + 5), 1, 1.1) for i in range(8)]  # too small a spread
    records += [health(10 * (i + 13), i % 4, 2.0) for i in range(8)]  # no single rank
    append_records(path, *records)
    findings = diagnose_reader(read_run(path))
    assert [f.check for f in findings] == ["all"]


# -- incremental diagnostics against the pandas checks ---------------------------------------------


def test_a_new_session_or_an_odd_column_checks_from_scratch(tmp_path: Path) -> None:
    """A new session starts the running checks again; a string loss hands over to the pandas checks."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(window(s) for s in range(10, 101, 10)))
    first = diagnose_reader(read_run(path))
    append_records(path, window(110))
    reader = read_run(path)
    args = {"train": reader.frame("train"), "sessions": reader.sessions, "ingest": reader.ingest_health(),
            "redone": reader.redone_by("train")}  # fmt: skip
    assert diagnose(**args, since=first).running.rows == 11
    append_records(path, window(120, session="s2"))
    reader = read_run(path)
    args |= {"train": reader.frame("train"), "sessions": reader.sessions,
             "redone": reader.redone_by("train")}  # fmt: skip
    assert first.running.extended(args["train"], args["sessions"], args["redone"]) is None
    assert diagnose(**args, since=first) == diagnose_from_scratch(**args)
    append_records(path, window(130, loss="oops"))  # type: ignore[arg-type]
    reader = read_run(path)
    args |= {"train": reader.frame("train")}
    found = diagnose(**args, since=first)
    assert found.running is None and found == diagnose_from_scratch(**args)


def test_the_findings_frame_of_the_checked_fields_finds_what_every_field_finds(tmp_path: Path) -> None:
    """The run page's memo gives the checks a train frame of ``CHECKED_FIELDS`` alone: over a run that
    trips a check of each kind (accounting, counters, tokens, a resume's loss and batch, a straggler,
    a missing loss), incremental and from scratch, it finds what the frame of every field finds."""
    path = tmp_path / "r" / "metrics.jsonl"
    ranks = [0, 3, 3, 3, 3, 3, 3, 3]
    append_records(
        path,
        *(health(10 * (i + 1), rank, 1.5 if rank == 3 else 1.05) for i, rank in enumerate(ranks)),
        window(90, tokens=1000), window(100, attempted=12, updates=10, skipped=1, cumulative_skipped=1),
        window(110, cumulative_skipped=5), base_record(120, train_loss=None), window(115, loss=1.2),
        base_record(60, event="session_start", session="s2"),
        *(window(s, "s2", loss=1.6, tokens=16000, seen=s * 1600) for s in range(70, 151, 10)),
    )  # fmt: skip
    reader = read_run(path)
    train = reader.frame("train")
    args = {"sessions": reader.sessions, "ingest": reader.ingest_health(),
            "redone": reader.redone_by("train")}  # fmt: skip
    every = diagnose_from_scratch(train=train, **args)
    assert len(checks(every)) >= 7
    checked = train[[column for column in train.columns if column in CHECKED_FIELDS]]
    assert diagnose_from_scratch(train=checked, **args) == every
    assert diagnose(train=checked, **args) == diagnose(train=train, **args) == every
