"""Run discovery, safe run-name resolution and run status from the log and the writer lock."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from metrics_core import MetricsWriter, RunContext, RunNotFoundError, TrainingState
from metrics_core.errors import RunPathError
from metrics_core.read import run_status as run_status_module
from metrics_core.read.file_systems import LOCAL_TYPES, file_system_type
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import run_status
from metrics_core.roots.discovery import UnreadableEntry, discover_runs, find_runs, resolve_run
from tests.support import append_bytes, append_records, base_record
from tests.support.dashboard import make_run


def test_discovery_nested_hidden_and_symlinked(tmp_path: Path) -> None:
    """Nested runs are found by relative name; hidden dirs and links leaving the root are not."""
    root = tmp_path / "runs"
    make_run(root / "a")
    make_run(root / "group" / "b")
    make_run(root / "group" / "deep" / "c")
    make_run(root / ".trash" / "old")
    make_run(tmp_path / "outside" / "secret")
    (root / "escape").symlink_to(tmp_path / "outside")
    (root / "alias").symlink_to(root / "group")
    (root / "group" / "notes").mkdir()
    names = [run.name for run in find_runs(root)]
    assert names == ["a", "group/b", "group/deep/c"]
    assert find_runs(root)[0].metrics_path == root / "a" / "metrics.jsonl"


def test_discovery_follows_links_only_inside_the_root_even_below_a_plain_directory(tmp_path: Path) -> None:
    """A metrics file or directory linking out of the root, deep under plain directories, is no run;
    a link to a run inside the root is listed once; the root reached through a link is walked."""
    outside = tmp_path / "outside"
    make_run(outside / "secret")
    real = tmp_path / "real"
    make_run(real / "team" / "deep" / "ok")
    (real / "team" / "deep" / "stolen").mkdir()
    (real / "team" / "deep" / "stolen" / "metrics.jsonl").symlink_to(outside / "secret" / "metrics.jsonl")
    (real / "team" / "deep" / "escape").symlink_to(outside)
    (real / "team" / "again").symlink_to(real / "team" / "deep" / "ok")
    (tmp_path / "root").symlink_to(real)
    assert [run.name for run in find_runs(tmp_path / "root")] == ["team/deep/ok"]


def test_discovery_depth_is_bounded(tmp_path: Path) -> None:
    """Runs deeper than max_depth are not searched for."""
    make_run(tmp_path / "x" / "y" / "z")
    assert [r.name for r in find_runs(tmp_path, max_depth=3)] == ["x/y/z"]
    assert find_runs(tmp_path, max_depth=2) == []


def test_symlink_loop_terminates(tmp_path: Path) -> None:
    """A link back to an ancestor is not followed twice."""
    make_run(tmp_path / "a")
    (tmp_path / "a" / "loop").symlink_to(tmp_path)
    assert [r.name for r in find_runs(tmp_path)] == ["a"]


def test_symlink_loops_and_links_through_a_file_are_named_and_every_run_is_listed(tmp_path: Path) -> None:
    """A link to itself, a metrics file linking to itself and a link through a file, at any depth, are
    each named with the reason; every run beside and below them is listed, by find_runs too."""
    make_run(tmp_path / "a")
    make_run(tmp_path / "group" / "b")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "group" / "deep").mkdir()
    (tmp_path / "group" / "deep" / "ring").symlink_to("../deep/ring")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "metrics.jsonl").symlink_to("metrics.jsonl")
    (tmp_path / "through").symlink_to("a/metrics.jsonl/inside")
    (tmp_path / "nowhere").symlink_to("missing")  # a link to nothing hides no run: skipped
    listing = discover_runs(tmp_path)
    assert [run.name for run in listing.runs] == ["a", "group/b"]
    assert listing.unreadable == (
        UnreadableEntry("c/metrics.jsonl", "symlink loop"),
        UnreadableEntry("group/deep/ring", "symlink loop"),
        UnreadableEntry("loop", "symlink loop"),
        UnreadableEntry("through", "not a directory"),
    )
    assert str(listing.unreadable[0]) == "c/metrics.jsonl: symlink loop"
    assert find_runs(tmp_path) == list(listing.runs)


def test_missing_root_is_a_clear_error(tmp_path: Path) -> None:
    """A runs root that does not exist raises, naming it."""
    with pytest.raises(RunNotFoundError, match="runs root"):
        find_runs(tmp_path / "nope")


def test_resolve_run_refuses_escapes(tmp_path: Path) -> None:
    """'..', absolute paths, symlink escapes and loops never resolve; real runs do."""
    root = tmp_path / "runs"
    make_run(root / "good")
    make_run(tmp_path / "outside")
    (root / "link").symlink_to(tmp_path / "outside")
    (root / "loop").symlink_to("loop")  # resolving it raised RuntimeError, not a clear refusal
    assert resolve_run(root, "good").directory == root / "good"
    for bad in ("../outside", str(tmp_path / "outside"), "good/../../outside", "link", "", "loop", "loop/x"):
        with pytest.raises(RunPathError):
            resolve_run(root, bad)
    with pytest.raises(RunNotFoundError):
        resolve_run(root, "missing")


NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def stamped(seconds_before_now: float, step: int, **extra: object) -> dict:
    when = NOW - timedelta(seconds=seconds_before_now)
    return base_record(step, **extra) | {"time": when.isoformat()}


@pytest.fixture
def locks_uncertain(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run files' file system carries no certain lock, as NFS may not: the heartbeat rule holds."""
    monkeypatch.setattr(run_status_module, "locks_are_certain", lambda path: False)


def test_status_transitions_with_injected_clock(tmp_path: Path, locks_uncertain: None) -> None:
    """Where a free lock may not mean a dead writer, recent records are live and silence past
    max(60 s, 5 gaps) is crashed without a writer."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(stamped(100 - 10 * i, i) for i in range(10)))  # every 10 s, last 10 s ago
    reader = RunReader(path)
    reader.refresh()
    assert run_status(reader, now=NOW) == "live"
    assert run_status(reader, now=NOW + timedelta(seconds=45)) == "live"  # floor of a minute
    assert run_status(reader, now=NOW + timedelta(seconds=70)) == "crashed"


def test_slow_cadence_raises_the_stall_threshold(tmp_path: Path, locks_uncertain: None) -> None:
    """A run logging every 5 minutes is still live 10 minutes after its last record."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(stamped(3000 - 300 * i, i) for i in range(10)))
    reader = RunReader(path)
    reader.refresh()
    assert run_status(reader, now=NOW + timedelta(minutes=10)) == "live"
    assert run_status(reader, now=NOW + timedelta(minutes=40)) == "crashed"


def test_a_run_on_a_local_disk_with_no_writer_is_crashed_at_once(tmp_path: Path, writer_lock: object) -> None:
    """On a local disk the writer's lock is certain: a run whose last record is a second old reads
    crashed at once when nobody holds its lock, and live while a writer does."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(stamped(100 - 10 * i, i) for i in range(10)))
    reader = RunReader(path)
    reader.refresh()
    assert file_system_type(path) in LOCAL_TYPES
    assert run_status(reader, now=NOW) == "crashed"
    writer_lock(path)
    assert run_status(reader, now=NOW) == "live"


def test_the_file_system_type_is_read_off_mountinfo_by_device(tmp_path: Path) -> None:
    """A path's file system type is its device's line of mountinfo; an unlisted device is not local."""
    device = os.stat(tmp_path).st_dev
    mountinfo = tmp_path / "mountinfo"
    line = "36 27 {}:{} / {} rw,relatime shared:1 - {} server:/export rw,vers=4.2\n"
    mountinfo.write_text(line.format(os.major(device), os.minor(device), tmp_path, "nfs4"))
    assert file_system_type(tmp_path, mountinfo=mountinfo) == "nfs4"
    assert file_system_type(tmp_path, mountinfo=tmp_path / "no-mountinfo") is None
    assert file_system_type(tmp_path / "missing") is None


def test_silent_run_with_its_writer_alive_is_stalled(tmp_path: Path) -> None:
    """A writer that still holds the lock but logs nothing is a hung job, not a crash."""
    run = RunContext(tmp_path / "r", "r", "s")
    with MetricsWriter(run) as writer:
        writer.write("train", TrainingState(step=1))
        reader = RunReader(run.directory)
        reader.refresh()
        assert reader.writer_alive() is True
        assert run_status(reader, now=datetime.now(timezone.utc)) == "live"
        assert run_status(reader, now=datetime.now(timezone.utc) + timedelta(hours=1)) == "stalled"
    assert reader.writer_alive() is False
    assert run_status(reader, now=datetime.now(timezone.utc) + timedelta(hours=1)) == "crashed"


@pytest.mark.parametrize("status", ["finished", "failed", "interrupted"])
def test_session_end_decides_the_status(tmp_path: Path, status: str) -> None:
    """A last session_end record gives its status, however old."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, stamped(20, 1), stamped(10, 2, event="session_end", status=status))
    reader = RunReader(path)
    reader.refresh()
    assert run_status(reader, now=NOW + timedelta(days=3)) == status


def test_torn_tail_without_writer_is_crashed_even_when_recent(tmp_path: Path) -> None:
    """Half a line and nobody writing: the trainer died mid-record."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, stamped(5, 1))
    append_bytes(path, b'{"schema_version":1,"ti')
    reader = RunReader(path)
    reader.refresh()
    assert run_status(reader, now=NOW) == "crashed"


def test_empty_file_is_empty(tmp_path: Path) -> None:
    """A run that has written nothing complete yet says so."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_bytes(path, b"")
    reader = RunReader(path)
    reader.refresh()
    assert run_status(reader, now=NOW) == "empty"
    assert os.path.exists(path)
