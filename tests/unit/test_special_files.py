"""Files that are not what a run's files should be.

A FIFO, a directory or an unreadable file where ``metrics.jsonl`` (or a cache file) belongs is
refused by every reader at once, in one line naming the path and why, never waited on.  On real
files and FIFOs; the terminal tools and forked writers are in
tests/integration/test_special_files_processes.py.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

from metrics_core import RunContext
from metrics_core.dashboard.store.rows import peek_row
from metrics_core.dashboard.store.run_store import RunStore, RunViewError
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.errors import RunFileError, WriterLockedError
from metrics_core.read.column_cache import CachePolicy, load
from metrics_core.read.run_digest import RunDigest, last_records
from metrics_core.read.run_file import LocalFile
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import StatusRecord, run_status, write_failure
from metrics_core.roots.discovery import find_runs, resolve_run
from metrics_core.write.failure_note import FAILURE_NOTE_FILENAME, NOTE_BYTES
from metrics_core.write.writer import MetricsWriter, TrainingState
from tests.support import read_records, small_run
from tests.support.reading import KINDS, special, written


@contextmanager
def no_waiting(seconds: float = 20.0) -> Iterator[None]:
    """Fail, instead of hanging the suite, if the block waits longer than ``seconds``: a SIGALRM
    interrupts a blocking ``open`` of a FIFO, and its handler fails the test with pytest's
    ``Failed``, a BaseException that no ``except Exception`` on the way swallows."""

    def waited(signum: int, frame: object) -> None:
        pytest.fail(f"waited over {seconds} s: something blocked on a special file")

    previous = signal.signal(signal.SIGALRM, waited)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_refused(error: BaseException, path: Path, kind: str) -> None:
    assert isinstance(error, RunFileError)
    message = str(error)
    assert "\n" not in message and str(path) in message and KINDS[kind] in message, message


# -- readers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["run directory", "file"])
@pytest.mark.parametrize("kind", KINDS)
def test_run_reader_refuses_a_special_metrics_file_at_once(tmp_path: Path, kind: str, given: str) -> None:
    """refresh() of a run, or of its metrics.jsonl, that is a FIFO or a directory raises RunFileError naming it."""
    path = special(tmp_path / "run" / "metrics.jsonl", kind)
    reader = RunReader(path.parent if given == "run directory" else path)
    with no_waiting(), pytest.raises(RunFileError) as raised:
        reader.refresh()
    assert_refused(raised.value, path, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_every_other_reader_refuses_or_ignores_a_special_metrics_file_at_once(tmp_path: Path, kind: str) -> None:
    """RunDigest and tail -n refuse it naming it; the peeked row, the failure note and the lock probe find nothing."""
    run = tmp_path / "run"
    path = special(run / "metrics.jsonl", kind)
    (run / FAILURE_NOTE_FILENAME).write_bytes(orjson.dumps(
        {"session_id": "s1", "time": "2026-11-29T10:00:00+00:00", "error": "disk full", "end": 0, "size": 0}
    ).ljust(NOTE_BYTES - 1) + b"\n")  # fmt: skip
    with no_waiting():
        for refused in (lambda: RunDigest(run), lambda: last_records(path, 5, keep=lambda record: True)):
            with pytest.raises(RunFileError) as raised:
                refused()
            assert_refused(raised.value, path, kind)
        assert peek_row("run", LocalFile(path)) is None
        status = StatusRecord(path, True, None, None, None, None, None, 0, None, lock_seen=False)
        assert write_failure(status) is None
        assert status.writer_alive() is None


def test_a_fifo_where_the_failure_note_belongs_is_no_note(tmp_path: Path) -> None:
    """run_status of a run beside a FIFO called .metrics.jsonl.failure answers at once: no note, so crashed."""
    path = tmp_path / "run" / "metrics.jsonl"
    small_run(path)
    special(path.parent / FAILURE_NOTE_FILENAME, "fifo")
    reader = RunReader(path)
    reader.refresh()
    with no_waiting():
        assert write_failure(reader) is None
        assert run_status(reader, now=datetime(2026, 12, 1, tzinfo=timezone.utc)) == "crashed"


def test_a_file_replaced_by_a_fifo_is_refused_by_the_reader_that_was_following_it(tmp_path: Path) -> None:
    """A reader that read the run keeps its records and refuses the FIFO that replaced the file."""
    path = tmp_path / "run" / "metrics.jsonl"
    small_run(path)
    reader = RunReader(path)
    assert reader.refresh() == 50
    path.unlink()
    special(path, "fifo")
    with no_waiting(), pytest.raises(RunFileError) as raised:
        reader.refresh()
    assert_refused(raised.value, path, "fifo")


def test_a_fifo_at_the_cache_path_is_ignored_without_waiting(tmp_path: Path) -> None:
    """The cache never opens a FIFO it finds where a run's cache file belongs: the run is parsed cold, then cached."""
    path = tmp_path / "run" / "metrics.jsonl"
    small_run(path)
    policy = CachePolicy(tmp_path / "cache", min_records=1)
    file = LocalFile(path)
    file.open()
    key = file.cache_key()
    file.close()
    special(policy.path_for(key), "fifo")
    with no_waiting():
        assert load(policy, key, max_record_bytes=1 << 20) is None
        reader = RunReader(path, cache=policy)
        assert reader.refresh() == 50 and not reader.served_from_cache
    assert policy.path_for(key).is_file()  # the save replaced the FIFO with a real cache file
    again = RunReader(path, cache=policy)
    again.refresh()
    assert again.served_from_cache and again.records == 50


# -- the dashboard's store -------------------------------------------------------------------------


def test_the_store_lists_special_runs_as_errors_naming_the_path_and_every_other_run_normally(tmp_path: Path) -> None:
    """A FIFO run and a directory run are error rows naming <run>/metrics.jsonl under the root; so is view()."""
    root = tmp_path / "runs"
    for name in ("alpha", "zeta"):
        small_run(root / name / "metrics.jsonl")
    special(root / "piped" / "metrics.jsonl", "fifo")
    special(root / "nested" / "folder" / "metrics.jsonl", "directory")
    assert [run.name for run in find_runs(root)] == ["alpha", "nested/folder", "piped", "zeta"]
    store = RunStore(root, StoreSettings(force_polling=True, load_budget_s=60.0))
    try:
        with no_waiting():
            rows = {row["run"]: row for row in store.runs_table().to_dict("records")}
        assert rows["alpha"]["status"] == rows["zeta"]["status"] == "crashed"
        assert rows["alpha"]["last step"] == 500 and not isinstance(rows["zeta"]["error"], str)
        for name, kind in (("piped", "fifo"), ("nested/folder", "directory")):
            error = rows[name]["error"]
            assert rows[name]["status"] == "error"
            assert error.startswith(f"{name}/metrics.jsonl: is a ") and KINDS[kind] in error, error
            assert str(tmp_path) not in error  # a page never shows the server's paths
            with no_waiting(), pytest.raises(RunViewError) as raised:
                store.view(name)
            assert raised.value.cause == error
    finally:
        store.close()


def test_resolve_run_finds_a_run_whose_metrics_file_is_special(tmp_path: Path) -> None:
    """A run page asked for a FIFO run gets the run (and then its error), not "no run there"."""
    special(tmp_path / "runs" / "piped" / "metrics.jsonl", "fifo")
    assert resolve_run(tmp_path / "runs", "piped").name == "piped"


# -- the terminal tools ----------------------------------------------------------------------------


# -- forked writers --------------------------------------------------------------------------------


def test_a_forked_child_is_refused_and_nothing_either_process_wrote_is_lost(run: RunContext) -> None:
    """os.fork(): the child's writes raise WriterForkedError naming both processes; no acknowledged record is lost."""
    acknowledged: list[tuple[int, float]] = []
    reply, tell = os.pipe()
    with MetricsWriter(run) as writer:
        for step in range(1, 4):
            writer.write("train", TrainingState(step=step), train_loss=1.0)
            acknowledged.append((step, 1.0))
        child = os.fork()
        if child == 0:  # pragma: no cover - measured in the child, reported through the pipe
            answers = []
            for step in (4, 5):
                try:
                    writer.write("train", TrainingState(step=step), train_loss=9.0)
                    answers.append([step, "written"])
                except BaseException as exc:
                    answers.append([step, f"{type(exc).__name__}: {exc}"])
            os.write(tell, orjson.dumps(answers))
            os._exit(0)
        os.close(tell)
        assert os.waitpid(child, 0)[1] == 0
        with os.fdopen(reply, "rb") as pipe:
            answers = orjson.loads(pipe.read())
        acknowledged += [(step, 9.0) for step, answer in answers if answer == "written"]
        for step in range(4, 7):  # the parent goes on where it left off
            writer.write("train", TrainingState(step=step), train_loss=1.0)
            acknowledged.append((step, 1.0))
    assert sorted(written(writer.path)) == sorted(acknowledged)
    for _, answer in answers:
        assert answer.startswith(f"WriterForkedError: {writer.path}: write() in process {child}, a fork of process "
                                 f"{os.getpid()}, which opened this writer; nothing was written"), answer  # fmt: skip
        assert "\n" not in answer and "its own MetricsWriter" in answer


def test_a_forked_child_that_lives_on_does_not_keep_the_runs_lock(run: RunContext) -> None:
    """After the parent closes its writer, the next writer opens, however long a forked child lives."""
    started, ready = os.pipe()
    go, wait = os.pipe()
    with MetricsWriter(run) as writer:
        writer.write("train", TrainingState(step=1), train_loss=1.0)
        child = os.fork()
        if child == 0:  # pragma: no cover - a child that outlives the parent's writer
            os.close(wait)
            os.write(ready, b"!")  # running: the fork hooks are done
            os.read(go, 1)  # until the parent closes its end
            os._exit(0)
        assert os.read(started, 1) == b"!"
    try:
        with MetricsWriter(run) as resumed:
            resumed.write("train", TrainingState(step=2), train_loss=0.5)
    except WriterLockedError as exc:
        pytest.fail(f"the forked child still holds the lock: {exc}")
    finally:
        for fd in (started, ready, go, wait):
            os.close(fd)
        os.waitpid(child, 0)
    assert [record["step"] for record in read_records(writer.path)] == [1, 2]
