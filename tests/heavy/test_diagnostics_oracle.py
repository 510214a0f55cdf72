"""Incremental diagnostics against the from-scratch checks after every append, on crafted and long runs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from metrics_core.analysis.diagnostics import diagnose, diagnose_reader
from metrics_core.analysis.loss_checks import diagnose_from_scratch
from metrics_core.read.health import Finding
from metrics_core.read.run_reader import RunReader
from tests.support import append_records, base_record, read_run
from tests.support.reading import window


def noisy_window(rng: random.Random, step: int, session: str, seen: int, skipped_total: int, scale: float) -> dict:
    """A train window of a run that goes wrong now and then, in every way a check looks for; tokens
    per update on the band's edges (400 and 1,600 around a median wandering over 799–801), so a
    moving median flips old verdicts; a data-parallel slowest rank in streaks."""
    tokens = int(scale * rng.choice([8000, 8010, 7990] * 3 + [4000, 3990, 4010, 16000, 16010, 15990, 1000]))
    attempted = 10
    skipped = rng.choice([0] * 8 + [1, 10])
    record = base_record(step, session=session, tokens=tokens, attempted_updates=attempted,
                         updates=attempted - skipped + (rng.random() < 0.03), skipped_updates_in_window=skipped,
                         train_loss=rng.uniform(1, 3))  # fmt: skip
    record |= {"tokens_seen": seen, "skipped_updates": skipped_total}
    if rng.random() < 0.05:
        del record["train_loss"]
    if rng.random() < 0.03:
        record["time"] = base_record(max(0, step - 500))["time"]  # a clock that went back
    rank = 3 if rng.random() < 0.7 else rng.randrange(4)
    record |= {"world_size": 4, "slowest_rank": rank, "rank_step_time_min_s": 0.2,
               "rank_step_time_max_s": 0.2 * rng.choice([1.05, 1.3, 1.5, 2.0])}  # fmt: skip
    return record


def noisy_run(seed: int) -> list[list[dict]]:
    """Three sessions (the later two resuming with a replay), as appends of 1 to 40 records."""
    rng = random.Random(seed)
    records, seen, skipped_total = [], 0, 0
    for session, start, end, scale in (("s1", 0, 1500, 1.0), ("s2", 1200, 2500, 1.0), ("s3", 2300, 4000, 1.25)):
        records.append(base_record(start, event="session_start", session=session, discarded_bytes=0,
                                   resumed_from_step=start or None))  # fmt: skip
        step = start
        while step < end:
            step += rng.choice([10] * 30 + [-20, 0, 20])
            window = noisy_window(rng, step, session, seen, skipped_total, scale)
            seen += window["tokens"] + (1000 if rng.random() < 0.02 else 0)
            skipped_total += window["skipped_updates_in_window"]
            records.append(window)
    batches, at = [], 0
    while at < len(records):
        size = rng.choice([1, 1, 1, 2, 5, 40])
        batches.append(records[at : at + size])
        at += size
    return batches


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_diagnostics_equal_the_pandas_checks_after_every_append(tmp_path: Path, seed: int) -> None:
    """Appending a noisy three-session run batch by batch: after each append, diagnose(since=the last
    findings) equals the pandas checks over everything, and it extended (not restarted) within a session."""
    path = tmp_path / "r" / "metrics.jsonl"
    batches = noisy_run(seed)
    append_records(path, *batches[0])
    reader = RunReader(path)
    previous: list[Finding] | None = None
    extended = 0
    for number, batch in enumerate(batches):
        if number:
            append_records(path, *batch)
        reader.refresh()
        train, sessions = reader.frame("train"), reader.sessions
        redone = reader.redone_by("train")
        ingest = reader.ingest_health()
        found = diagnose(train=train, sessions=sessions, redone=redone, ingest=ingest, since=previous)
        assert found == diagnose_from_scratch(train=train, sessions=sessions, redone=redone, ingest=ingest)
        assert found.running is not None or not len(train)  # an empty frame has no dtypes to go on
        before = getattr(previous, "running", None)
        if before is not None and before.session_ids == tuple(session.session_id for session in sessions):
            assert before.extended(train, sessions, redone) is not None
            extended += 1
        previous = found
    checks = {finding.check for finding in previous}
    assert {"window accounting", "tokens per update", "tokens_seen vs windows", "steps increasing",
            "times increasing", "missing loss", "no successful update", "straggler rank"} <= checks  # fmt: skip
    assert extended >= len(batches) - 10  # all but the appends that started a session


def test_checking_each_append_from_the_previous_findings_counts_every_row(tmp_path: Path) -> None:
    """Fifteen windows appended one by one to a 20k- and a 200k-window run, each checked from the previous
    findings (``since``): the running check counts every row.  What a check costs is measured in benchmarks/."""
    runs = {}
    for size in (20_000, 200_000):
        path = tmp_path / str(size) / "metrics.jsonl"
        append_records(path, *(window(s) for s in range(10, 10 * size + 1, 10)))
        reader = read_run(path)
        runs[size] = (path, reader, diagnose_reader(reader))
    for round_ in range(15):
        for size, (path, reader, previous) in runs.items():
            append_records(path, window(10 * size + 10 * (round_ + 1)))
            reader.refresh()
            found = diagnose(train=reader.frame("train"), sessions=reader.sessions, ingest=reader.ingest_health(),
                             redone=reader.redone_by("train"),
                             since=previous)  # fmt: skip
            assert found.running is not None and found.running.rows == size + round_ + 1
            runs[size] = (path, reader, found)
