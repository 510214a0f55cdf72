"""What another user of the node can do through files: the runs root they can write into, and a
cache directory they can write into.  Every attack is made deterministic by calling the layers
in the order a race would interleave them (discovery, the swap, the open).

The owner's private run lies in a 0700 directory outside the root; the other user owns a run
in the root and turns its file (or its directory) into a link to the private run after
discovery listed it.  No reader may hand out a byte of the private run.
"""

from __future__ import annotations

import io
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from metrics_core.alerts.evaluator import AlertEvaluator
from metrics_core.cli.main import main
from metrics_core.dashboard.store.rows import peek_row
from metrics_core.errors import RunFileError
from metrics_core.roots.runs_root import LocalRoot
from metrics_core.sql import export
from metrics_core.testing.records import base_record
from tests.support import append_records

SECRET = 4242.5  # the private run's loss: found in no answer
PRIVATE_ROWS = 49


@pytest.fixture
def private_run(tmp_path: Path) -> Path:
    """The owner's private run: a 0700 directory outside the runs root."""
    directory = tmp_path / "home" / "private"
    append_records(
        directory / "metrics.jsonl",
        *(base_record(step, train_loss=SECRET, lr=1e-3) for step in range(1, PRIVATE_ROWS + 1)),
    )
    directory.chmod(0o700)
    return directory


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A shared runs root holding the other user's run ``evil`` (three records) and a run ``ok``."""
    root = tmp_path / "runs"
    for name in ("evil", "ok"):
        append_records(root / name / "metrics.jsonl", *(base_record(step, train_loss=2.0) for step in (1, 2, 3)))
    return root


def swap_file(root: Path, private_run: Path) -> None:
    """``evil/metrics.jsonl`` becomes a link to the private run's file."""
    (root / "evil" / "metrics.jsonl").unlink()
    (root / "evil" / "metrics.jsonl").symlink_to(private_run / "metrics.jsonl")


def swap_directory(root: Path, private_run: Path) -> None:
    """``evil`` itself becomes a link to the private run's directory."""
    (root / "evil" / "metrics.jsonl").unlink()
    (root / "evil").rmdir()
    (root / "evil").symlink_to(private_run)


@pytest.mark.parametrize("swap", [swap_file, swap_directory])
def test_a_run_swapped_for_a_link_between_discovery_and_the_open_is_refused(root, private_run, swap) -> None:
    """The reader a root makes for a listed run refuses the file it would open outside the root,
    naming why; the peeked row finds nothing; the other run reads."""
    runs = LocalRoot(root, watch=False)
    listing = {run.name: run for run in runs.discover().runs}
    swap(root, private_run)
    reader = runs.reader(listing["evil"], cache=None)
    with pytest.raises(RunFileError, match="outside the runs root"):
        reader.refresh()
    assert reader.records == 0
    assert peek_row("evil", runs.peek_file(listing["evil"])) is None
    ok = runs.reader(listing["ok"], cache=None)
    assert ok.refresh() == 3


def test_a_run_read_once_then_swapped_is_not_read_again(root, private_run) -> None:
    """Every reopen is judged again: a reader that read the run, then finds its path replaced by a
    link out of the root, refuses it rather than read the link's target."""
    runs = LocalRoot(root, watch=False)
    (evil,) = [run for run in runs.discover().runs if run.name == "evil"]
    reader = runs.reader(evil, cache=None)
    assert reader.refresh() == 3
    swap_file(root, private_run)
    with pytest.raises(RunFileError, match="outside the runs root"):
        reader.refresh()
    assert reader.records == 0  # what it had read is void, and nothing was read in its place


def test_the_sql_export_of_a_run_swapped_after_discovery_holds_no_private_row(
    root, private_run, tmp_path, monkeypatch
) -> None:
    """An export whose run is swapped for a link between the listing and the read reports it as
    failed and writes no file holding the private run's rows."""
    pq = pytest.importorskip("pyarrow.parquet")

    class SwappedAfterListing(LocalRoot):
        def discover(self):  # the other user's swap lands just after the walk
            listing = super().discover()
            swap_file(root, private_run)
            return listing

    monkeypatch.setattr(export, "open_root", lambda location, watch: SwappedAfterListing(location, watch=watch))
    report = export.export_root(root, tmp_path / "out")
    assert [name for name, _ in report.failed] == ["evil"] and report.written == ("ok",)
    for file in (tmp_path / "out").glob("*.parquet"):
        assert SECRET not in pq.read_table(file).column("train_loss").to_pylist()


def test_the_alerter_does_not_read_a_run_swapped_for_a_link(root, private_run) -> None:
    """A run whose file becomes a link out of the root after a pass read it is an error of that
    run at the next pass, never the private run's records (its NaN-free loss aside, no alert)."""
    now = datetime.now(timezone.utc)
    append_records(root / "evil" / "metrics.jsonl", base_record(4, train_loss=2.0, time=int(now.timestamp() * 1e9)))
    evaluator = AlertEvaluator(root)
    evaluator.evaluate(now=now)
    read = evaluator.stats["records"]
    swap_file(root, private_run)
    evaluator.evaluate(now=now)
    assert evaluator.stats["records"] == read and evaluator.stats["errors"] == 1


@pytest.mark.parametrize("command", [["summary"], ["tail", "-n", "5"]])
def test_the_terminal_tools_refuse_a_run_file_that_links_out_of_the_run_named(root, private_run, command) -> None:
    """``summary`` and ``tail`` of a run whose file is a link out of its directory print no record
    of the target, and say why."""
    swap_file(root, private_run)
    out, err = io.StringIO(), io.StringIO()
    assert main([*command, str(root / "evil")], out, err) == 2
    assert str(SECRET) not in out.getvalue() and "outside the runs root" in err.getvalue()


def test_a_link_inside_the_root_is_still_read(root) -> None:
    """A run file that is a link to another file inside the root is read, as discovery lists it."""
    (root / "alias").mkdir()
    (root / "alias" / "metrics.jsonl").symlink_to(root / "ok" / "metrics.jsonl")
    runs = LocalRoot(root, watch=False)
    (alias,) = [run for run in runs.discover().runs if run.name == "alias"]
    assert runs.reader(alias, cache=None).refresh() == 3
    assert os.path.islink(root / "alias" / "metrics.jsonl")
