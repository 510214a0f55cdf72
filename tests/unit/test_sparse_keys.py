"""Keys held on few records (a per-task evaluation every thousand steps) cost what they hold, and
read back exactly as if every key were a full column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pytest

from metrics_core.dashboard.figures.metric_figures import metric_figure
from metrics_core.dashboard.figures.run_charts import run_charts
from metrics_core.dashboard.figures.series_traces import LONE_SUFFIX
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.snapshot import Lineage, build_view
from metrics_core.dashboard.views.chart_specs import ChartOptions, Series
from metrics_core.dashboard.views.memo import view_charts_of, view_x_keys
from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.column_table import SparseColumn
from metrics_core.read.run_reader import RunReader
from metrics_core.sql.export_table import run_slices, run_table
from metrics_core.testing.generate import write_run
from tests.support import append_bytes, base_record, line

RECORDS, KEYS, EVALS = 4_000, 300, 6
PATHS = {"pyarrow": 0, "per-line": 1 << 40}


def _written(path: Path) -> dict[str, dict[int, float]]:
    """Every ``eval/`` key's values by train step, as the file holds them."""
    held: dict[str, dict[int, float]] = {}
    for record in map(orjson.loads, path.read_bytes().splitlines()):
        for key, value in record.items():
            if key.startswith("eval/"):
                held.setdefault(key, {})[record["step"]] = value
    return held


@pytest.mark.parametrize("threshold", PATHS.values(), ids=PATHS.keys())
def test_a_run_with_thousands_of_sparse_values_holds_them_in_bytes_of_what_it_holds(
    tmp_path: Path, threshold: int
) -> None:
    """300 keys on 6 of 4,000 records add about their 1,800 values to the reader's columns, not
    300 columns of every row; each key reads back with its values at its steps."""
    sparse, plain = tmp_path / "sparse" / "metrics.jsonl", tmp_path / "plain" / "metrics.jsonl"
    write_run(sparse, RECORDS, eval_keys=KEYS, evals=EVALS)
    write_run(plain, RECORDS)
    readers = {}
    for path in (sparse, plain):
        readers[path] = RunReader(path, bulk_threshold=threshold)
        readers[path].refresh()
    extra = readers[sparse].resident_bytes() - readers[plain].resident_bytes()
    assert extra <= KEYS * EVALS * 32, extra  # a row number and a value each, with a buffer's slack
    written = _written(sparse)
    frame = readers[sparse].frame("train")
    assert len(written) == KEYS and set(written) <= set(frame.columns)
    for key, values in written.items():
        held = frame[key].notna().to_numpy()
        assert dict(zip(frame["step"][held].tolist(), frame[key][held].tolist(), strict=True)) == values
        assert frame[key].dtype == np.float64


def test_the_form_a_column_takes_never_changes_what_it_holds(tmp_path: Path) -> None:
    """A key dense at first and then rare, one rare and then on every record, and rare keys of every
    kind read the same as per record, through live appends of one record, blocks and pyarrow, and a
    cache's save and load; and they are stored sparse or dense as what they hold says."""
    path = tmp_path / "run" / "metrics.jsonl"
    steps = iter(range(1, 10**6))
    rows = [base_record(next(steps), early=1.5, count=3) for _ in range(3)]
    rows += [base_record(next(steps)) for _ in range(2_000)]  # ``early`` and ``count`` now rare
    rows += [base_record(next(steps), note="x", flag=True, mixed=2, late=0.5) for _ in range(2)]
    rows += [base_record(next(steps), mixed="text") for _ in range(500)]
    rows += [base_record(next(steps), late=float(n)) for n in range(1_500)]  # ``late`` on every record
    blocks = [rows[:3], *[[row] for row in rows[3:8]], rows[8:2_100], rows[2_100:]]
    policy = CachePolicy(tmp_path / "cache", min_records=1)
    path.parent.mkdir()
    live = RunReader(path.parent, bulk_threshold=1 << 40)
    for block in blocks:
        append_bytes(path, b"".join(map(line, block)))
        live.refresh()
    expected = pd.DataFrame(rows).drop(columns="event")
    cached = RunReader(path, cache=policy)
    cached.refresh()
    restored = RunReader(path, cache=policy)
    restored.refresh()
    assert restored.served_from_cache
    for reader in (live, cached, restored, RunReader(path, bulk_threshold=0)):
        reader.refresh()
        frame = reader.frame("train")
        for key in ("early", "count", "note", "flag", "mixed", "late"):
            got = frame[key].astype(object).where(frame[key].notna(), None).tolist()
            assert got == expected[key].astype(object).where(expected[key].notna(), None).tolist(), key
        assert frame["count"].dtype == np.float64 and frame["note"].dtype == "category"
        stored = {key: isinstance(reader.column("train", key), SparseColumn) for key in ("early", "note", "late")}
        assert stored == {"early": True, "note": True, "late": False}


def test_every_sparse_key_is_listed_charted_with_a_marker_per_lone_value_and_exported(tmp_path: Path) -> None:
    """On the dashboard each of 300 rare keys has its chart, whose values, each alone between
    gaps, are drawn as markers at their steps; the SQL export holds every one at its step."""
    path = tmp_path / "runs" / "evals" / "metrics.jsonl"
    write_run(path, RECORDS, eval_keys=KEYS, evals=EVALS)
    written = _written(path)
    store = RunStore(path.parent.parent)
    try:
        view = store.view("evals")
        held = sum(view.columns["train"].array(key).nbytes for key in written)
        assert held <= KEYS * EVALS * 32, held  # the snapshot holds what they hold, not their rows
        assert {chart.key for chart in view_charts_of(view)} >= {f"key:{key}" for key in written}
        for key in ("eval/task_0000", "eval/task_0123", f"eval/task_{KEYS - 1:04d}"):
            figure = run_charts(view, ChartOptions(only=key, history="all"))[f"key:{key}"]
            lone = [trace for trace in figure["data"] if trace["name"].endswith(LONE_SUFFIX)]
            drawn = {int(x): float(y) for trace in lone for x, y in zip(trace["x"], trace["y"], strict=True)}
            assert drawn == pytest.approx(written[key], rel=1e-6)
            assert all(trace["mode"] == "markers" for trace in lone)
    finally:
        store.close()
    reader = RunReader(path)
    reader.refresh()
    table = run_table(reader, "evals").to_pydict()
    for key, values in written.items():
        held = {step: value for step, value in zip(table["step"], table[key], strict=True) if value is not None}
        assert held == values


def test_a_value_no_line_reaches_gets_a_marker_and_a_line_gets_none() -> None:
    """Among gaps, a lone value is drawn as a marker; values beside each other are a line, unmarked."""
    values = [np.nan, 1.0, np.nan, 2.0, 3.0, np.nan, np.nan, 4.0]
    frame = pd.DataFrame(
        {
            "step": np.arange(len(values)),
            "session_id": pd.Categorical(["s"] * len(values)),
            "value": values,
        }
    )
    figure = metric_figure([Series(frame, "value", "value")], title="v", sessions=[])
    (lone,) = [trace for trace in figure["data"] if trace.get("name", "").endswith(LONE_SUFFIX)]
    assert list(lone["x"]) == [1, 7] and list(lone["y"]) == [1.0, 4.0] and lone["mode"] == "markers"
    dense = pd.DataFrame({"step": [0, 1, 2], "session_id": pd.Categorical(["s"] * 3), "value": [1.0, 2.0, 3.0]})
    figure = metric_figure([Series(dense, "value", "value")], title="v", sessions=[])
    assert not [trace for trace in figure["data"] if trace.get("name", "").endswith(LONE_SUFFIX)]


def test_the_export_writes_a_run_of_rare_keys_a_bounded_slice_at_a_time(tmp_path: Path) -> None:
    """Exported, 300 rare keys over 4,000 records are never all dense at once: each slice holds
    about the values asked for, and the slices together are the run's table."""
    path = tmp_path / "evals" / "metrics.jsonl"
    write_run(path, RECORDS, eval_keys=KEYS, evals=EVALS)
    reader = RunReader(path)
    reader.refresh()
    schema, slices = run_slices(reader, "evals", values=100_000)
    parts = list(slices())
    assert len(schema) > KEYS and len(parts) > 10
    assert max(part.nbytes for part in parts) <= 100_000 * 9  # a float and its validity bit each
    assert pa.concat_tables(parts).equals(run_table(reader, "evals"))
    assert sum(part.num_rows for part in parts) == reader.records


def test_a_live_append_without_those_keys_hands_the_next_snapshot_what_it_held(tmp_path: Path) -> None:
    """An append that logs none of the rare keys costs their columns nothing: the next snapshot
    gets the same held rows and values (no array rebuilt per key), whose SparseArray is one more
    row long, and the keys' x-axis answers are carried."""
    path = tmp_path / "evals" / "metrics.jsonl"
    write_run(path, RECORDS, eval_keys=KEYS, evals=EVALS)
    reader = RunReader(path)
    reader.refresh()
    lineage = Lineage()
    before = build_view("evals", reader, "running", lineage)
    assert view_x_keys(before) == ()
    last = reader.sessions[-1].session_id
    append_bytes(path, line(base_record(10**7, session=last, train_loss=1.0)))
    reader.refresh()
    after = build_view("evals", reader, "running", lineage, previous=before)
    for key in ("eval/task_0000", f"eval/task_{KEYS - 1:04d}"):
        held = after.columns["train"].held(key)
        assert held is not None and held is before.columns["train"].held(key)
        assert len(after.columns["train"].array(key)) == after.rows("train") == before.rows("train") + 1
    assert view_x_keys(after) == ()
