"""MetricsWriter in real processes: killed with SIGKILL mid-loop or mid-line, refused a second
writer, and failing on a full disk or a file size limit."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

from metrics_core import (
    MetricsWriter,
    RunContext,
    TrainingState,
    WriterLockedError,
)
from metrics_core.errors import WriteFailedError
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import run_status, write_failure
from metrics_core.write.training_session import training_session
from tests.support import read_records, spawn_python

CUT_THEN_DIE = """
import sys, time
from metrics_core import MetricsWriter, RunContext
with MetricsWriter(RunContext(sys.argv[1], "r", "doomed")) as w:
    print(w.discarded_bytes, flush=True)
    time.sleep(60)
"""


def test_writer_killed_before_its_first_write_leaves_the_cut_to_the_next(run: RunContext) -> None:
    """SIGKILL between open and the first write: the torn tail is still there, and the next session reports it."""
    with MetricsWriter(run) as writer:
        writer.write("session_start", TrainingState(), discarded_bytes=0)
    torn = b'{"schema_version":1,"event":"tr'
    with open(writer.path, "ab") as out:
        out.write(torn)
    child = spawn_python(CUT_THEN_DIE, str(run.directory))
    try:
        assert child.stdout.readline().strip() == str(len(torn)), child.stderr.read()
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert writer.path.read_bytes().endswith(b"}\n" + torn)
    with MetricsWriter(RunContext(run.directory, "exp1", "s3")) as writer:
        writer.write("session_start", TrainingState(), discarded_bytes=writer.discarded_bytes)
    reader = RunReader(writer.path)
    reader.refresh()
    assert [(s.session_id, s.discarded_bytes) for s in reader.sessions] == [("s1", 0), ("s3", len(torn))]


LOCK_HOLDER = """
import sys
from metrics_core import MetricsWriter, RunContext, TrainingState
with MetricsWriter(RunContext(sys.argv[1], "r", "holder")) as w:
    w.write("session_start", TrainingState())
    print("ready", flush=True)
    sys.stdin.readline()
print("closed", flush=True)
"""


def test_second_writer_process_is_refused_until_the_first_closes(run: RunContext) -> None:
    """A real second process holding the file makes this one fail with a message naming the file."""
    holder = spawn_python(LOCK_HOLDER, str(run.directory))
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        with pytest.raises(WriterLockedError, match="another writer") as info:
            with MetricsWriter(RunContext(run.directory, "r", "intruder")):
                pass
        assert str(run.directory / "metrics.jsonl") in str(info.value)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
    finally:
        holder.kill()
        holder.wait()
    with MetricsWriter(RunContext(run.directory, "r", "next")) as writer:
        writer.write("session_start", TrainingState())
    assert [r["session_id"] for r in read_records(writer.path)] == ["holder", "next"]


PROBE_LOCK = """
import sys
from metrics_core import MetricsWriter, RunContext, WriterLockedError
try:
    with MetricsWriter(RunContext(sys.argv[1], "r", "probe")):
        print("acquired")
except WriterLockedError:
    print("refused")
"""


def test_reader_closing_the_file_in_the_writers_process_keeps_the_lock(run: RunContext) -> None:
    """Opening and closing the file for reading (as the dashboard would) must not drop the lock."""
    with MetricsWriter(run) as writer:
        with open(writer.path, "rb") as peek:
            peek.read()
        probe = subprocess.run(
            [sys.executable, "-c", PROBE_LOCK, str(run.directory)], capture_output=True, text=True, check=True
        )
        assert probe.stdout.strip() == "refused"


LOOP_WRITER = """
import sys
from metrics_core import MetricsWriter, RunContext, TrainingState
state = TrainingState()
with MetricsWriter(RunContext(sys.argv[1], "r", "doomed")) as w:
    while True:
        state.step += 1
        state.tokens_seen += 4096
        w.write("train", state, train_loss=10.0 / state.step, lr=3e-4, tokens=4096,
                attempted_updates=1, updates=1, skipped_updates_in_window=0,
                grad_norm_avg=1.0, grad_norm_max=1.0, clipped_fraction=0.0)
        print(state.step, flush=True)
"""


def test_sigkill_mid_loop_loses_no_written_record(run: RunContext) -> None:
    """Every record a killed writer reported as written is on disk; the next session continues."""
    child = spawn_python(LOOP_WRITER, str(run.directory))
    last_reported = 0
    deadline = time.monotonic() + 30
    while last_reported < 2000 and time.monotonic() < deadline:
        last_reported = int(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    path = run.directory / "metrics.jsonl"
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    steps = [orjson.loads(line)["step"] for line in complete.splitlines()]
    assert steps == list(range(1, len(steps) + 1)), "records must be whole and in order"
    assert len(steps) >= last_reported
    with MetricsWriter(RunContext(run.directory, "r", "resumed")) as writer:
        assert writer.discarded_bytes == len(data) - len(complete)
        writer.write("session_start", TrainingState(step=steps[-1]), discarded_bytes=writer.discarded_bytes)
    records = read_records(path)
    assert records[-1]["session_id"] == "resumed" and len(records) == len(steps) + 1


TORN_WRITER = """
import sys, time
from metrics_core import MetricsWriter, RunContext, TrainingState
with MetricsWriter(RunContext(sys.argv[1], "r", "doomed")) as w:
    for step in range(1, 4):
        w.write("train", TrainingState(step=step), train_loss=1.0)
    # A trainer dying inside a multi-part write leaves half a line behind.
    with open(w.path, "ab") as out:
        out.write(b'{"schema_version":1,"event":"train","step":4,"train_lo')
    print("torn", flush=True)
    time.sleep(60)
"""


def test_sigkill_with_torn_line_then_resume_cuts_only_the_tail(run: RunContext) -> None:
    """A process killed with half a line on disk: the next session cuts just that and appends."""
    child = spawn_python(TORN_WRITER, str(run.directory))
    assert child.stdout.readline().strip() == "torn", child.stderr.read()
    child.send_signal(signal.SIGKILL)
    child.wait()
    with MetricsWriter(RunContext(run.directory, "r", "resumed")) as writer:
        assert writer.discarded_bytes == len(b'{"schema_version":1,"event":"train","step":4,"train_lo')
        writer.write("train", TrainingState(step=4), train_loss=0.5)
    assert [(r["session_id"], r["step"]) for r in read_records(writer.path)] == [
        ("doomed", 1),
        ("doomed", 2),
        ("doomed", 3),
        ("resumed", 4),
    ]


DISK_FULL_WRITER = """
import json, resource, signal, sys
from metrics_core import MetricsError, MetricsWriter, RunContext, TrainingState
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # Python ignores it already; a trainer may not
failures = []

def failed(exc):
    failures.append({"type": type(exc).__name__, "errno": exc.errno, "filename": exc.filename, "message": str(exc),
                     "library": isinstance(exc, MetricsError)})

state = TrainingState()
with MetricsWriter(RunContext(sys.argv[1], "r", sys.argv[2])) as w:
    limit = w.path.stat().st_size + int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        w.write("session_start", state, discarded_bytes=w.discarded_bytes)
        while True:
            state.step += 1
            w.write("train", state, train_loss=1.0, pad="p" * 150)
    except OSError as exc:
        failed(exc)
    try:
        w.write("session_end", state, status="failed", error="disk full")
    except OSError as exc:
        failed(exc)
print(json.dumps({"step": state.step, "failures": failures}))
"""


def run_until_the_file_size_limit(directory: Path, session_id: str, room: int) -> dict:
    """Run a real writer process allowed ``room`` more bytes than the file has; return what it saw."""
    result = subprocess.run(
        [sys.executable, "-c", DISK_FULL_WRITER, str(directory), session_id, str(room)],
        capture_output=True,
        text=True,
        check=True,
    )
    return orjson.loads(result.stdout)


def test_file_size_limit_raises_write_failed_and_the_run_reads_as_failed(run: RunContext) -> None:
    """EFBIG mid-line: WriteFailedError naming file and cause, no torn line, status failed with the reason."""
    outcome = run_until_the_file_size_limit(run.directory, "s1", 5000)
    path = run.directory / "metrics.jsonl"
    assert len(outcome["failures"]) == 2, "the failed train write and the failed session_end"
    for failure in outcome["failures"]:
        assert failure["type"] == "WriteFailedError" and failure["library"]
        assert failure["errno"] == errno.EFBIG and failure["filename"] == str(path)
        assert failure["message"] == (
            f"{path}: write failed: File too large (EFBIG); "
            "the file still ends on a complete record; this record was not written"
        )
    records = read_records(path)
    assert [r["event"] for r in records] == ["session_start"] + ["train"] * (outcome["step"] - 1)
    assert [r["step"] for r in records[1:]] == list(range(1, outcome["step"]))
    reader = RunReader(path)
    reader.refresh()
    assert reader.pending_bytes == 0 and reader.bad_lines == 0
    assert run_status(reader, now=datetime.now(timezone.utc)) == "failed"
    failure = write_failure(reader)
    assert failure is not None and (failure.session_id, failure.error) == ("s1", "File too large (EFBIG)")
    assert abs(failure.time.timestamp() - time.time()) < 60


def test_a_resumed_session_is_not_marked_failed_by_an_old_note(run: RunContext) -> None:
    """The note of a failed write goes stale as soon as any later record is written."""
    run_until_the_file_size_limit(run.directory, "s1", 3000)
    reader = RunReader(run.directory)
    reader.refresh()
    assert run_status(reader, now=datetime.now(timezone.utc)) == "failed"
    with MetricsWriter(RunContext(run.directory, "exp1", "s2")) as writer:
        assert writer.discarded_bytes == 0
        writer.write("session_start", TrainingState(), discarded_bytes=0)
        reader.refresh()
        assert write_failure(reader) is None
        assert run_status(reader, now=datetime.now(timezone.utc)) == "live"
    assert (run.directory / ".metrics.jsonl.failure").stat().st_size == 1024, "the note never grows"


def test_failed_first_write_over_a_torn_tail_keeps_the_tail_for_the_next_report(run: RunContext) -> None:
    """EFBIG while the first line overwrites a torn tail: the tail keeps its length, so its cut is still reported."""
    with MetricsWriter(run) as writer:
        writer.write("session_start", TrainingState(), discarded_bytes=0)
    torn = b'{"schema_version":1,"event":"train","pad":"' + b"t" * 57
    with open(writer.path, "ab") as out:
        out.write(torn)
    complete = len(writer.path.read_bytes()) - len(torn)
    # 50 bytes past the tail: the ~250-byte session_start line overwrites the tail, then hits the limit.
    outcome = run_until_the_file_size_limit(run.directory, "s2", 50)
    assert outcome["step"] == 0 and [f["errno"] for f in outcome["failures"]] == [errno.EFBIG] * 2
    data = writer.path.read_bytes()
    assert len(data) == complete + len(torn) and b"\n" not in data[complete:]
    reader = RunReader(writer.path)
    reader.refresh()
    assert reader.pending_bytes == len(torn) and reader.writer_alive() is False
    assert run_status(reader, now=datetime.now(timezone.utc)) == "failed", "failed, not crashed"
    with MetricsWriter(RunContext(run.directory, "exp1", "s3")) as writer:
        assert writer.discarded_bytes == len(torn)
        writer.write("session_start", TrainingState(), discarded_bytes=writer.discarded_bytes)
    reader.refresh()
    assert [(s.session_id, s.discarded_bytes) for s in reader.sessions] == [("s1", 0), ("s3", len(torn))]


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB filesystem that fills up (tmpfs); needs root to mount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        # Lazy: a descriptor still open (a failed test's reader) must not leave the mount behind.
        subprocess.run(["umount", "--lazy", str(mount_point)], check=True)


def test_full_filesystem_raises_write_failed_and_the_run_reads_as_failed(tiny_tmpfs: Path) -> None:
    """ENOSPC on a real full filesystem: every earlier record intact, the run failed with the reason."""
    directory = tiny_tmpfs / "runs" / "a"
    state = TrainingState()
    written = []
    with MetricsWriter(RunContext(directory, "a", "s1")) as writer:
        written.append(writer.write("session_start", state, discarded_bytes=0))
        with pytest.raises(WriteFailedError) as info:
            while True:
                state.step += 1
                written.append(writer.write("train", state, train_loss=1.0, pad="p" * 300))
        with pytest.raises(WriteFailedError):
            writer.write("session_end", state, status="failed", error="disk full")
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    assert info.value.filename == str(writer.path)
    assert str(info.value) == (
        f"{writer.path}: write failed: No space left on device (ENOSPC); "
        "the file still ends on a complete record; this record was not written"
    )
    assert read_records(writer.path) == written
    reader = RunReader(writer.path)
    reader.refresh()
    assert run_status(reader, now=datetime.now(timezone.utc)) == "failed"
    assert write_failure(reader).error == "No space left on device (ENOSPC)"
    subprocess.run(["mount", "-o", "remount,size=256k", str(tiny_tmpfs)], check=True)
    with MetricsWriter(RunContext(directory, "a", "s2")) as writer:
        writer.write("session_start", state, discarded_bytes=writer.discarded_bytes)
        reader.refresh()
        assert run_status(reader, now=datetime.now(timezone.utc)) == "live"
    reader.close()
    assert read_records(writer.path)[:-1] == written


def test_training_session_on_a_full_disk_propagates_the_original_exception(tiny_tmpfs: Path) -> None:
    """The trainer's own error, not the session_end write failure, reaches the caller; the run reads failed."""
    directory = tiny_tmpfs / "runs" / "b"
    with pytest.raises(ZeroDivisionError):
        with training_session(directory, handle_sigterm=False) as session:
            with pytest.raises(WriteFailedError):
                while True:
                    session.log("train", train_loss=1.0, pad="p" * 300)
            raise ZeroDivisionError("the loss diverged")
    reader = RunReader(directory)
    reader.refresh()
    assert run_status(reader, now=datetime.now(timezone.utc)) == "failed"
    reader.close()


def test_importing_metrics_core_stays_light() -> None:
    """The training side must not pull in the UI or data stack."""
    code = (
        "import sys, metrics_core, metrics_core.write.writer, metrics_core.write.window\n"
        "heavy = {'streamlit', 'plotly', 'pandas', 'numpy', 'watchdog', 'torch', 'pyarrow'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
