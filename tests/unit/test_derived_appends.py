"""Throughput is one rule (``read.throughput``): a snapshot's own series, extended per append, is
equal after every append to what the terminal's ``tail`` prints for the same records (``Rates``,
the oracle), and computed only for the rows appended."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np

from metrics_core.analysis.derived import tokens_per_second
from metrics_core.dashboard.store.snapshot import Lineage, build_view
from metrics_core.dashboard.views.chart_specs import DEFAULT_CHARTS, chart_fields, logged_keys
from metrics_core.read.run_digest import batches, follow_file
from metrics_core.read.run_reader import RunReader
from metrics_core.read.throughput import Rates, tokens_per_second_rows
from tests.support import append_records, base_record

FIELDS = {"session_id", "step", "tokens_seen", "time", "tokens_per_s"}


def terminal_rates(path: Path) -> np.ndarray:
    """The rate ``tail`` prints at each train record of the run file (NaN where it prints none)."""
    rates = Rates()
    records = [record for batch in batches(follow_file(path)) for record in batch.records]
    return np.array([math.nan if (r := rates(x)) is None else r for x in records if x["event"] == "train"], dtype=float)


def test_throughput_rows_against_the_row_before_in_the_same_session() -> None:
    """Row against the row before it, NaN at a session's start and where time stood still."""
    tokens = np.array([0.0, 100.0, 300.0, 0.0, 50.0, 50.0, 80.0])
    times = np.array([0, 1, 2, 10, 11, 11, 13], dtype=np.float64) * 1e9
    sessions = np.array([0, 0, 0, 1, 1, 1, 1])
    expected = [np.nan, 100.0, 200.0, np.nan, 50.0, np.nan, 15.0]
    np.testing.assert_allclose(tokens_per_second_rows(tokens, times, sessions), expected)


def test_the_dashboard_and_the_terminal_compute_the_same_throughput(tmp_path: Path) -> None:
    """Over random runs (sessions that resume, and two that write in turn; time standing still or
    going back; counts going back): the snapshot's series and a frame's ``tokens_per_second`` are
    what ``tail`` prints."""
    rng = random.Random(7)
    for run in range(6):
        path = tmp_path / f"run{run}" / "metrics.jsonl"
        records, seen = [], 0
        for step in range(1, 120):
            session = f"s{step // 40}" if step % 40 > 8 else rng.choice([f"s{step // 40}", f"s{step // 40 - 1}"])
            seen += rng.choice([0, 800, 800, 1600, -100])
            moment = (
                base_record(step)["time"] if step < 3 or rng.random() < 0.9 else records[-rng.choice([1, 2])]["time"]
            )
            records.append(base_record(step, session=session, tokens_seen=seen) | {"time": moment})
        append_records(path, *records)
        reader = RunReader(path.parent)
        reader.refresh()
        view = build_view("run", reader, "live")
        expected = terminal_rates(path)
        assert len(expected) == len(records) and np.isfinite(expected).sum() > 60
        np.testing.assert_allclose(view.frame("train", FIELDS)["tokens_per_s"].to_numpy(), expected, rtol=1e-9)
        np.testing.assert_allclose(tokens_per_second(view.frame("train")).to_numpy(), expected, rtol=1e-9)


def test_a_snapshot_extends_throughput_per_append_equal_to_the_oracle(tmp_path: Path) -> None:
    """Appends to the last session extend the previous snapshot's series (the same buffer, no
    recomputation); a new session rebuilds it; after each, it equals what ``tail`` prints."""
    path = tmp_path / "run" / "metrics.jsonl"
    append_records(path, *(base_record(s, tokens_seen=s * 1000) for s in range(1, 50)))
    reader, lineage = RunReader(path.parent), Lineage()
    reader.refresh()
    view = build_view("run", reader, "live", lineage)
    first = view.frame("train", FIELDS)["tokens_per_s"].to_numpy()
    np.testing.assert_allclose(first, terminal_rates(path), rtol=1e-9)
    for step in range(50, 60):
        append_records(path, base_record(step, tokens_seen=step * 1000 + step % 3))
        reader.refresh()
        view = build_view("run", reader, "live", lineage, previous=view)
        series = view.frame("train", FIELDS)["tokens_per_s"].to_numpy()
        np.testing.assert_allclose(series, terminal_rates(path), rtol=1e-9)
        assert np.shares_memory(series, first)  # extended in the same buffer
    append_records(
        path, base_record(40, session="s2", tokens_seen=40_000), base_record(41, session="s2", tokens_seen=41_500)
    )
    reader.refresh()
    view = build_view("run", reader, "live", lineage, previous=view)
    np.testing.assert_allclose(view.frame("train", FIELDS)["tokens_per_s"].to_numpy(), terminal_rates(path), rtol=1e-9)


def test_throughput_is_no_logged_key_and_a_logged_one_is_charted_instead(tmp_path: Path) -> None:
    """The derived series is in the default charts' frames but not among the user's keys; a run that
    logs its own ``tokens_per_s`` keeps its values and gets no derived series."""
    path = tmp_path / "run" / "metrics.jsonl"
    append_records(path, *(base_record(s) for s in range(1, 5)))
    reader = RunReader(path.parent)
    reader.refresh()
    view = build_view("run", reader, "live")
    assert "tokens_per_s" in view.frame("train", chart_fields(DEFAULT_CHARTS)).columns
    assert "tokens_per_s" not in logged_keys(view)
    logged = tmp_path / "logged" / "metrics.jsonl"
    append_records(logged, *(base_record(s, tokens_per_s=7.0) for s in range(1, 5)))
    reader = RunReader(logged.parent)
    reader.refresh()
    view = build_view("logged", reader, "live")
    assert view.columns["train"].derived == ()
    assert view.frame("train", FIELDS)["tokens_per_s"].tolist() == [7.0] * 4


def test_a_live_append_extends_a_resumed_runs_effective_rows_in_place(tmp_path: Path) -> None:
    """On a run a later session redid, the effective rows a page picked are extended by a live
    append, not picked again: the new snapshot's columns share memory with the previous one's,
    equal a snapshot's built from scratch, and the frames a page still holds keep their rows
    (an append past the buffers' slack included)."""
    path = tmp_path / "r" / "metrics.jsonl"
    resumed = (base_record(s, session="s2", train_loss=2.0 / s, tokens_seen=90 * s) for s in range(200, 260))
    append_records(path, *(base_record(s, train_loss=1.0 / s, tokens_seen=100 * s) for s in range(1, 300)),
                   base_record(200, event="session_start", session="s2"), *resumed)  # fmt: skip
    reader = RunReader(path.parent)
    reader.refresh()
    fields = FIELDS | {"train_loss"}
    view = build_view("run", reader, "live", Lineage())
    held = [(view.effective("train", fields), view.effective("train", fields).copy())]
    for step, count in ((260, 5), (265, 1), (266, 900), (1166, 3)):
        append_records(path, *(base_record(s, session="s2", train_loss=2.0 / s, tokens_seen=90 * s)
                               for s in range(step, step + count)))  # fmt: skip
        reader.refresh()
        view = build_view("run", reader, "live", view.lineage, previous=view)
        frame = view.effective("train", fields)
        scratch = build_view("run", reader, "live").effective("train", fields)
        assert view.superseded["train"].any() and len(frame) == len(scratch)
        np.testing.assert_array_equal(frame.columns, scratch.columns)
        for name in fields:
            np.testing.assert_array_equal(np.asarray(frame[name]), np.asarray(scratch[name]))
        if count < 900:  # within the slack: the previous snapshot's rows are this one's
            before = held[-1][0]
            for name in ("step", "train_loss", "tokens_seen", "tokens_per_s"):
                assert np.shares_memory(frame[name].to_numpy(), before[name].to_numpy()), name
            assert np.shares_memory(frame["time"].array._ndarray, before["time"].array._ndarray)
        held.append((frame, frame.copy()))
    for frame, copy in held:
        for name in fields:
            np.testing.assert_array_equal(np.asarray(frame[name]), np.asarray(copy[name]))
