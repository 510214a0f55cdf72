"""What another user of the node can do through files: the runs root they can write into, and a
cache directory they can write into.  Every attack is made deterministic by calling the layers
in the order a race would interleave them (discovery, the swap, the open).

The owner's private run lies in a 0700 directory outside the root; the other user owns a run
in the root and turns its file (or its directory) into a link to the private run after
discovery listed it.  No reader may hand out a byte of the private run.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

from metrics_core.alerts.alerter import Alerter, load_state, save_state
from metrics_core.alerts.evaluator import AlertEvaluator
from metrics_core.cli.main import main
from metrics_core.dashboard.store.rows import peek_row
from metrics_core.errors import RunFileError
from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.run_file import lies_within
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import StatusRecord, write_failure
from metrics_core.roots.runs_root import LocalRoot
from metrics_core.sql import export
from metrics_core.testing.records import base_record
from metrics_core.write.failure_note import FAILURE_NOTE_FILENAME, NOTE_BYTES
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
def test_a_run_swapped_for_a_link_between_discovery_and_the_open_is_refused(
    root, private_run, swap, descriptor_names
) -> None:
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


@pytest.fixture(params=["/proc", "no /proc"])
def descriptor_names(request, monkeypatch) -> str:
    """Both ways the check finds where an opened file lies: by ``/proc``'s name of the descriptor
    (Linux), and, where there is none, by resolving the path and comparing device and inode."""
    if request.param == "no /proc":
        readlink = os.readlink

        def without_proc(path, *args, **kwargs):
            if str(path).startswith("/proc/"):
                raise FileNotFoundError(path)
            return readlink(path, *args, **kwargs)

        monkeypatch.setattr(os, "readlink", without_proc)
    return request.param


def test_a_link_swapped_back_between_the_open_and_the_check_is_still_caught(
    root, private_run, descriptor_names
) -> None:
    """The race the other way round: the open follows the link to the private run, then the link
    is swapped back to a plain file inside the root before the check looks; the descriptor is
    still judged outside."""
    path = root / "evil" / "metrics.jsonl"
    swap_file(root, private_run)
    fd = os.open(path, os.O_RDONLY)
    try:
        path.unlink()
        append_records(path, base_record(1, train_loss=2.0))
        assert not lies_within(fd, path, root.resolve())
    finally:
        os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert lies_within(fd, path, root.resolve())
    finally:
        os.close(fd)


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


def test_the_status_of_a_run_swapped_for_a_link_reads_nothing_beside_the_target(root, private_run) -> None:
    """A released run's status, once its directory became a link out of the root, reads neither
    the failure note nor the lock beside the link's target (the note would name the owner's error)."""
    size = (private_run / "metrics.jsonl").stat().st_size
    note = {"session_id": "s1", "time": "2026-11-29T10:00:00+00:00", "error": "secret", "end": size, "size": size}
    (private_run / FAILURE_NOTE_FILENAME).write_bytes(orjson.dumps(note).ljust(NOTE_BYTES - 1) + b"\n")
    runs = LocalRoot(root, watch=False)
    (evil,) = [run for run in runs.discover().runs if run.name == "evil"]
    reader = runs.reader(evil, cache=None)
    reader.refresh()
    released = StatusRecord.of(reader, identity=reader.read_identity)
    reader.close()
    swap_directory(root, private_run)
    assert write_failure(released) is None and released.writer_alive() is None


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


# -- what the tools write, and what they read back as their own --------------------------------


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The umask of a user private group (002): a directory made by it is group-writable."""
    before = os.umask(0o002)
    yield
    os.umask(before)


def private_modes(directory: Path) -> dict[str, int]:
    """Every entry under ``directory`` (itself as ``.``) and its permission bits, checked to be
    0700 for a directory and 0600 for a file."""
    found = {".": stat.S_IMODE(directory.stat().st_mode)}
    for path in directory.rglob("*"):
        found[path.relative_to(directory).as_posix()] = stat.S_IMODE(path.lstat().st_mode)
    assert found == {name: 0o700 if (directory / name).is_dir() else 0o600 for name in found}
    return found


def test_an_export_and_its_directory_are_the_users_alone_whatever_the_umask(root, tmp_path, loose_umask) -> None:
    """The export directory is made 0700; the Parquet files, the manifest and the lock 0600."""
    pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "exports" / "out"
    export.export_root(root, out)
    found = private_modes(tmp_path / "exports")
    assert {name for name in found if name.endswith(".parquet")} and {"out/_manifest.json", "out/.export.lock"} <= set(
        found
    )


def test_the_sql_cache_directories_are_made_private_and_an_older_loose_one_tightened(
    root, tmp_path, loose_umask
) -> None:
    """``<cache>/sql/<hash>/`` and everything in it: 0700 and 0600;
    an export directory an older version left 0755 is made 0700."""
    pytest.importorskip("pyarrow.parquet")
    from metrics_core.sql.query import export_for_query

    home = tmp_path / "cache"
    directory, _ = export_for_query(root, home)
    directory.chmod(0o755)
    (directory.parent).chmod(0o775)
    export_for_query(root, home)
    assert any(name.endswith(".parquet") for name in private_modes(home))


def test_the_columnar_cache_directory_and_files_are_private(tmp_path, loose_umask) -> None:
    """A cache directory made by a save is 0700, its file 0600."""
    run = tmp_path / "runs" / "big"
    append_records(run / "metrics.jsonl", *(base_record(step, train_loss=2.0) for step in range(1, 201)))
    policy = CachePolicy(tmp_path / "home" / "cache", min_records=1)
    RunReader(run, cache=policy).refresh()
    assert len(private_modes(tmp_path / "home")) == 3  # home, cache and the run's file


def poisoned_cache(run: Path, tmp_path: Path) -> Path:
    """A valid cache file (its checksum right) for ``run``'s file, whose train loss is 1234.5 in
    every row: what another user can make of a run they can read."""
    policy = CachePolicy(tmp_path / "attacker", min_records=1)
    reader = RunReader(run, cache=policy)
    reader.refresh()
    pending = reader.capture_cache()
    pending.parse.tables["train"].columns["train_loss"].view()[:] = 1234.5
    assert pending.write()
    (made,) = policy.directory.glob("*.mcc")
    return made


def planted_in_a_world_writable_directory(cache: Path, made: list[Path]) -> None:
    cache.mkdir(mode=0o777)
    cache.chmod(0o1777)  # like /tmp: anyone may add a file
    for file in made:
        shutil.copy(file, cache / file.name)


def planted_by_another_user(cache: Path, made: list[Path]) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    cache.mkdir(mode=0o700)
    for file in made:
        shutil.copy(file, cache / file.name)
        os.chown(cache / file.name, 4321, 4321)


def planted_writable_by_others(cache: Path, made: list[Path]) -> None:
    cache.mkdir(mode=0o700)
    for file in made:
        shutil.copy(file, cache / file.name)
        (cache / file.name).chmod(0o666)


@pytest.mark.parametrize(
    "plant", [planted_in_a_world_writable_directory, planted_by_another_user, planted_writable_by_others]
)
def test_a_planted_cache_file_is_refused_with_one_warning_and_the_run_read_from_its_file(
    tmp_path, caplog, plant
) -> None:
    """A cache file with a valid checksum that another user could have written (a world-writable
    cache directory, a file of another user's, a file anyone may write) is not used: the runs
    show their own losses, and one warning says why, however many runs would have used it."""
    runs = []
    for name in ("a", "b"):
        run = tmp_path / "runs" / name
        append_records(run / "metrics.jsonl", *(base_record(step, train_loss=2.0) for step in range(1, 201)))
        runs.append(run)
    cache = tmp_path / "shared-cache"
    plant(cache, [poisoned_cache(run, tmp_path / run.name) for run in runs])
    policy = CachePolicy(cache, min_records=1)
    with caplog.at_level(logging.WARNING, logger="metrics_core.read.private_files"):
        for run in runs:
            reader = RunReader(run, cache=policy)
            reader.refresh()
            assert not reader.served_from_cache
            assert set(reader.frame("train")["train_loss"]) == {2.0}
            reader.close()
    (warning,) = caplog.records
    assert "refused" in warning.getMessage() and str(cache) in warning.getMessage()


def test_a_query_refuses_a_cache_directory_others_can_write(root, tmp_path) -> None:
    """The SQL export and its spills never go into a cache directory another user can write:
    a planted export would answer the query."""
    from metrics_core.read.private_files import UntrustedCacheError
    from metrics_core.sql.query import export_for_query, spill_directory

    home = tmp_path / "cache"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    for call in (lambda: export_for_query(root, home), lambda: spill_directory(home)):
        with pytest.raises(UntrustedCacheError, match="writable by group or others"):
            call()
    assert not (home / "sql").exists()


def test_the_alerts_state_is_written_private_and_never_through_a_link(root, tmp_path, loose_umask) -> None:
    """``alerts --state FILE``: the state file is 0600, and a link another user left at the name
    the temporary file once had (``FILE.tmp``) writes nothing over the file it points at."""
    victim = tmp_path / "victim"
    victim.write_text("the owner's file")
    state = tmp_path / "state.json"
    (tmp_path / "state.json.tmp").symlink_to(victim)
    save_state(state, Alerter(root))
    assert victim.read_text() == "the owner's file" and load_state(state) == {}
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
