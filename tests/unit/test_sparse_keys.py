"""Keys held on few records (a per-task evaluation every thousand steps) cost what they hold, and
read back exactly as if every key were a full column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.column_table import SparseColumn
from metrics_core.read.run_reader import RunReader
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
