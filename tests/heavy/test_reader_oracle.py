"""RunReader after every append equals a fresh reader, and a refresh's work does not grow with the run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from metrics_core.read.records import check_lines
from metrics_core.read.run_reader import RunReader
from tests.support import append_bytes, base_record
from tests.support.reading import CountingFile, redone_by_oracle


def _assert_same_as_a_fresh_reader(reader: RunReader, bulk_threshold: int) -> None:
    """Sessions, frames and supersession masks of ``reader`` equal those of a reader opened now."""
    fresh = RunReader(reader.path, bulk_threshold=bulk_threshold)
    fresh.refresh()
    assert reader.sessions == fresh.sessions
    assert reader.events == fresh.events
    for event in fresh.events:
        pd.testing.assert_frame_equal(reader.frame(event), fresh.frame(event))
        np.testing.assert_array_equal(reader.superseded(event), fresh.superseded(event))
        np.testing.assert_array_equal(reader.redone_by(event), fresh.redone_by(event))
        np.testing.assert_array_equal(fresh.redone_by(event), redone_by_oracle(fresh, event))


def _oracle_appends() -> list[bytes | None]:
    """Appends that exercise every path that changes a frame or the sessions; None = rewrite the file."""

    def lines(*records: dict) -> bytes:
        return b"".join(orjson.dumps(record) + b"\n" for record in records)

    def train(step: int, session: str, **values: object) -> dict:
        return base_record(step, session=session, **{"train_loss": 1.0 / step, "tokens": 1000, **values})

    resumed = base_record(30, event="session_start", session="s2", resumed_from_step=30, discarded_bytes=9)
    torn = lines(train(61, "s2", phase="cool"))
    # 150 one-record sessions and categories, 15 per append: past 127 of each, pandas' codes widen
    many = [lines(*(base_record(100 - n, session=f"m{n}", phase=f"p{n}", ok=n % 3 == 0) for n in range(i, i + 15)))
            for i in range(0, 150, 15)]  # fmt: skip
    return [
        lines(
            base_record(0, event="session_start", session="s1"),
            *(train(step, "s1", phase="warm", ok=True) for step in range(10, 60, 10)),
        ),
        lines(train(60, "s1", phase="warm", ok=False)),
        b'{"schema_version": 1, "broken\n'
        + lines(*(base_record(step, event="validation", session="s1", val_loss=0.5) for step in (30, 50))),
        lines(resumed, train(40, "s2", phase="warm")),  # a new session that redoes s1's steps 40..60
        lines(train(50, "s2", ok=None), train(60, "s2", phase="cool")),
        torn[:30],
        torn[30:],
        lines(base_record(30, event="validation", session="s2", val_loss=0.4)),  # at its first step: s1's 30 redone
        lines(base_record(60, event="checkpoint", session="s2", path="/ckpt/60")),  # a new event
        lines(train(70, "s2", tokens="many", ok=True), train(80, "s2", train_loss=2)),  # values change type
        # one record per append (``Table.append``): a value of its column's kind, or not
        lines(train(81, "s2", train_loss=3, count=1)),  # an int into a float column; a new int column
        lines(train(82, "s2", count=2, tokens=5)),  # an int into an int column, and into one of objects
        lines(train(83, "s2", count=None)),  # a missing value: the int column becomes float
        lines(train(85, "s2", count=True, flag=1)),  # a bool into a float column
        lines(train(86, "s2", flag=True, nested={"a": 1})),  # a bool into an int column; not a scalar
        lines(train(65, "s1", phase="late")),  # an earlier session reappears (two writers): still exact
        *many,
        lines(train(75, "s1")),  # and again once s2's replay is final: it redid this one too
        None,
        lines(base_record(0, event="session_start", session="r1"), train(10, "r1", phase="new")),
        lines(train(20, "r1", tokens=987654321)).replace(b"987654321", b"%d" % (1 << 63)),  # beyond int64: a float
    ]


@pytest.mark.parametrize("bulk_threshold", [0, 1 << 40], ids=["pyarrow", "per-line"])
def test_after_every_append_sessions_and_frames_equal_a_fresh_reader(metrics: Path, bulk_threshold: int) -> None:
    """The kept conversions and replay accounting, extended append by append (new sessions, a replay,
    bad and torn lines, type changes, wider category codes, a rewrite), equal a reader opened anew,
    and frames handed out earlier do not change."""
    metrics.parent.mkdir()
    reader = RunReader(metrics.parent, bulk_threshold=bulk_threshold)
    held: list[tuple[pd.DataFrame, pd.DataFrame]] = []
    for data in _oracle_appends():
        if data is None:
            metrics.write_bytes(b"")
        else:
            append_bytes(metrics, data)
        reader.refresh()
        _assert_same_as_a_fresh_reader(reader, bulk_threshold)
        for frame, copy in held:
            pd.testing.assert_frame_equal(frame, copy)
        held.extend((frame, frame.copy(deep=True)) for frame in map(reader.frame, reader.events))
    assert reader.resets == 1 and reader.bad_lines == 0 and len(reader.sessions) == 1


def test_refresh_after_ten_appends_reads_and_parses_the_same_on_a_tenfold_longer_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scaled-down refresh-cost scenario: bytes read and lines parsed do not grow with the run (counts)."""
    import metrics_core.read.run_reader as reader_module
    from metrics_core.testing.generate import record, write_run

    parsed = [0]

    def counting_check_lines(block: bytes, first_line: int, **kwargs: object) -> object:
        parsed[0] += block.count(b"\n")
        return check_lines(block, first_line, **kwargs)

    work = {}
    for count in (20_000, 200_000):
        path = tmp_path / f"run{count}" / "metrics.jsonl"
        write_run(path, count)
        file = CountingFile(path)
        reader = RunReader(path, file=file)
        reader.refresh()
        file.bytes_read = parsed[0] = 0
        monkeypatch.setattr(reader_module, "check_lines", counting_check_lines)
        for round_ in range(5):
            append_bytes(path, b"".join(record("s", "train", 10**9 + round_ * 10 + i, 0, 0, 10**18) for i in range(10)))
            assert reader.refresh() == 10
        monkeypatch.undo()
        work[count] = (file.bytes_read, parsed[0])
    assert work[200_000][1] == work[20_000][1] == 50
    assert work[200_000][0] <= 3 * work[20_000][0]
