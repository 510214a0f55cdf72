"""CSV tables imported as runs and read back through the public reader: empty cells missing,
text columns named and left out, re-imports adding only new rows."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from metrics_core.errors import MetricsError
from metrics_core.imports.csv_import import import_csv
from metrics_core.read.run_reader import RunReader


def read(run_dir: Path) -> RunReader:
    reader = RunReader(run_dir)
    reader.refresh()
    return reader


def test_a_table_becomes_a_run_with_missing_cells_missing(tmp_path: Path) -> None:
    """step, wall_time, loss (to train_loss), val_loss (to a validation record), a sparse column:
    an empty cell is no value, never a zero; times are the table's."""
    table = tmp_path / "t.csv"
    table.write_text("step,wall_time,loss,val_loss,acc\n1,1700000000,2.5,,0.1\n2,1700000010,2.0,3.0,\n")
    report = import_csv(table, tmp_path / "root", run="exp/a")
    assert (report.sessions, report.scalars) == (1, 4)
    reader = read(tmp_path / "root" / "exp" / "a")
    train = reader.frame("train")
    assert list(train["train_loss"]) == [2.5, 2.0]
    assert train["acc"].iloc[0] == 0.1 and math.isnan(train["acc"].iloc[1])
    assert list(reader.frame("validation")["val_loss"]) == [3.0]
    assert train["time"].iloc[1] == datetime.fromtimestamp(1700000010, timezone.utc)
    assert reader.sessions[0].end_status == "finished"


def test_a_text_column_is_named_and_not_imported(tmp_path: Path) -> None:
    """A column holding text is said once in the report and absent from the run."""
    table = tmp_path / "t.csv"
    table.write_text("Step,loss,note\n1,2.5,warmup\n2,2.0,\n")
    report = import_csv(table, tmp_path / "root", run="a")
    assert report.notes == [f"{table}: column 'note' is not numeric (line 2: 'warmup'); not imported"]
    assert "note" not in read(tmp_path / "root" / "a").fields("train")


def test_importing_again_adds_only_the_new_rows(tmp_path: Path) -> None:
    """A second import of the same table writes nothing; rows appended since are added, once; a
    partial last line waits for its newline."""
    table = tmp_path / "t.csv"
    table.write_text("_step,loss\n1,2.5\n2,2.0\n3,1.")
    import_csv(table, tmp_path / "root", run="a")
    metrics = tmp_path / "root" / "a" / "metrics.jsonl"
    before = metrics.read_bytes()
    assert import_csv(table, tmp_path / "root", run="a").scalars == 0
    assert metrics.read_bytes() == before
    with table.open("a") as file:
        file.write("5\n4,1.2\n")
    assert import_csv(table, tmp_path / "root", run="a").scalars == 2
    assert list(read(metrics.parent).frame("train")["train_loss"]) == [2.5, 2.0, 1.5, 1.2]


def test_a_table_without_a_step_column_is_refused(tmp_path: Path) -> None:
    """No step column: the error names the columns it found, and nothing is written."""
    table = tmp_path / "t.csv"
    table.write_text("epoch,loss\n1,2.5\n")
    with pytest.raises(MetricsError, match="no step column"):
        import_csv(table, tmp_path / "root", run="a")
    assert not (tmp_path / "root" / "a" / "metrics.jsonl").exists()


@pytest.mark.parametrize("name", ["../escape", "/abs", "a/../../b", ".hidden", ""])
def test_a_run_name_outside_the_root_is_refused(tmp_path: Path, name: str) -> None:
    """--run names a directory inside the root, nothing else."""
    table = tmp_path / "t.csv"
    table.write_text("step,loss\n1,2.5\n")
    with pytest.raises(MetricsError, match="run name"):
        import_csv(table, tmp_path / "root", run=name)
