"""MetricsWriter: record format, tail recovery, refusal of bad input, locking, real crashes."""

from __future__ import annotations

import errno
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrics_core import (
    MetricsError,
    MetricsWriter,
    RecordTypeError,
    RecordValueError,
    RunContext,
    TrainingState,
    WriterLockedError,
    WriterStateError,
)
from metrics_core.errors import WriteFailedError
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import run_status, write_failure
from metrics_core.write.training_session import training_session
from metrics_core.write.writer import MAX_CONFIG_BYTES
from tests.support import read_records, spawn_python


def test_path_is_metrics_jsonl_and_directory_is_created(run: RunContext) -> None:
    """The writer owns run.directory/metrics.jsonl and creates missing directories."""
    assert not run.directory.exists()
    with MetricsWriter(run) as writer:
        assert writer.path == run.directory / "metrics.jsonl"
        assert writer.discarded_bytes == 0
    assert writer.path.is_file()


def test_run_context_accepts_str(tmp_path: Path) -> None:
    """RunContext.directory may be given as a str and becomes a Path."""
    ctx = RunContext(str(tmp_path / "r"), "r", "s")
    assert ctx.directory == tmp_path / "r"


def test_record_has_base_fields_and_is_returned_as_written(run: RunContext) -> None:
    """A record is one flat JSON line with the base fields first, identical to what write returns."""
    state = TrainingState(step=7, tokens_seen=7000, skipped_updates=1)
    with MetricsWriter(run) as writer:
        returned = writer.write("train", state, train_loss=2.5, lr=3e-4, note="warmup", flag=True, gap=None)
    raw = writer.path.read_bytes()
    assert raw.count(b"\n") == 1 and raw.endswith(b"\n")
    (on_disk,) = read_records(writer.path)
    assert on_disk == returned
    assert list(on_disk)[:8] == [
        "schema_version",
        "time",
        "run_id",
        "session_id",
        "event",
        "step",
        "tokens_seen",
        "skipped_updates",
    ]
    assert on_disk["schema_version"] == 1
    assert (on_disk["run_id"], on_disk["session_id"], on_disk["event"]) == ("exp1", "s1", "train")
    assert (on_disk["step"], on_disk["tokens_seen"], on_disk["skipped_updates"]) == (7, 7000, 1)
    assert on_disk["gap"] is None and on_disk["note"] == "warmup" and on_disk["flag"] is True
    when = datetime.fromisoformat(on_disk["time"])
    assert when.utcoffset() is not None and when.utcoffset().total_seconds() == 0


def test_any_object_with_the_three_counters_is_a_state(run: RunContext) -> None:
    """The writer reads only step, tokens_seen and skipped_updates from the state."""

    class Trainer:
        step, tokens_seen, skipped_updates, model = np.int64(3), 300, 0, object()

    with MetricsWriter(run) as writer:
        record = writer.write("checkpoint", Trainer(), path="ckpt-3.pt")
    assert record["step"] == 3 and type(record["step"]) is int


def test_state_counter_of_wrong_type_is_refused(run: RunContext) -> None:
    """A float step is a caller bug: TypeError naming the counter, nothing written."""
    with MetricsWriter(run) as writer:
        with pytest.raises(RecordTypeError, match=r"state\.step .*float"):
            writer.write("train", TrainingState(step=1.5))
    assert writer.path.read_bytes() == b""


def test_sessions_append_and_keep_prior_lines(run: RunContext) -> None:
    """A second session appends after the first one's complete lines without touching them."""
    state = TrainingState()
    with MetricsWriter(run) as writer:
        for step in range(3):
            state.step = step
            writer.write("train", state, train_loss=1.0 / (step + 1))
    before = writer.path.read_bytes()
    resumed = RunContext(run.directory, run.run_id, "s2")
    with MetricsWriter(resumed) as writer:
        assert writer.discarded_bytes == 0
        writer.write("session_start", state, discarded_bytes=writer.discarded_bytes)
    after = writer.path.read_bytes()
    assert after.startswith(before)
    assert [r["session_id"] for r in read_records(writer.path)] == ["s1", "s1", "s1", "s2"]


@pytest.mark.parametrize("tail_len", [1, 150, 4095, 4096, 4097, 3 * 4096 + 17])
def test_torn_tail_is_cut_exactly_by_the_first_write(run: RunContext, tail_len: int) -> None:
    """Only the bytes after the last newline are cut, by the first write, whatever their length."""
    with MetricsWriter(run) as writer:
        writer.write("train", TrainingState(step=1), train_loss=1.0)
        writer.write("train", TrainingState(step=2), train_loss=0.9)
    complete = writer.path.read_bytes()
    torn = (b'{"schema_version":1,"x":"' + b"y" * tail_len)[:tail_len]
    writer.path.write_bytes(complete + torn)
    resumed = RunContext(run.directory, run.run_id, "s2")
    with MetricsWriter(resumed) as writer:
        assert writer.discarded_bytes == tail_len
        assert writer.path.read_bytes() == complete + torn, "the tail stays until a record reports its cut"
        record = writer.write("session_start", TrainingState(step=2), discarded_bytes=writer.discarded_bytes)
        assert writer.path.read_bytes() == complete + orjson.dumps(record) + b"\n"
        writer.write("train", TrainingState(step=3), train_loss=0.8)
    assert [r["step"] for r in read_records(writer.path)] == [1, 2, 2, 3]


@pytest.mark.parametrize("size", [1, 4096, 4097, 50_000])
def test_file_without_any_newline_is_replaced_by_the_first_record(run: RunContext, size: int) -> None:
    """A file holding no complete line is all torn tail: kept by an idle writer, cut by the first write."""
    run.directory.mkdir(parents=True)
    (run.directory / "metrics.jsonl").write_bytes(b"x" * size)
    with MetricsWriter(run) as writer:
        assert writer.discarded_bytes == size
    assert writer.path.read_bytes() == b"x" * size
    with MetricsWriter(run) as writer:
        assert writer.discarded_bytes == size
        record = writer.write("session_start", TrainingState(), discarded_bytes=writer.discarded_bytes)
    assert read_records(writer.path) == [record]


@settings(max_examples=200, deadline=None)
@given(
    content=st.one_of(
        st.binary(max_size=300),
        st.lists(st.sampled_from([b"\n", b"a" * 4095, b"{}", b"\xff", b"b" * 4096, b"\n\n"]), max_size=8).map(b"".join),
    )
)
def test_tail_recovery_property(tmp_path_factory: pytest.TempPathFactory, content: bytes) -> None:
    """For any content: opening changes nothing; the first write keeps exactly the prefix up to the last newline."""
    directory = tmp_path_factory.mktemp("prop")
    (directory / "metrics.jsonl").write_bytes(content)
    expected = content[: content.rfind(b"\n") + 1]
    with MetricsWriter(RunContext(directory, "r", "s")) as writer:
        assert writer.path.read_bytes() == content
        assert writer.discarded_bytes == len(content) - len(expected)
        record = writer.write("session_start", TrainingState(), discarded_bytes=writer.discarded_bytes)
    assert writer.path.read_bytes() == expected + orjson.dumps(record) + b"\n"


def test_reader_never_sees_the_torn_tail_or_a_shrink_while_it_is_cut(run: RunContext) -> None:
    """A reader tailing the file across the deferred cut gets each record once and never restarts."""
    with MetricsWriter(run) as writer:
        writer.write("train", TrainingState(step=1), train_loss=1.0)
    torn = b'{"schema_version":1,"event":"train","step":2,"note":"' + b"z" * 600
    with open(writer.path, "ab") as out:
        out.write(torn)
    reader = RunReader(writer.path)
    assert reader.refresh() == 1 and reader.pending_bytes == len(torn)
    with MetricsWriter(RunContext(run.directory, "exp1", "s2")) as writer:
        assert reader.refresh() == 0 and reader.pending_bytes == len(torn)
        writer.write("session_start", TrainingState(step=1), discarded_bytes=writer.discarded_bytes)
        assert reader.refresh() == 1 and reader.pending_bytes == 0
        writer.write("train", TrainingState(step=2), train_loss=0.5)
    assert reader.refresh() == 1
    assert reader.resets == 0 and reader.bad_lines == 0
    assert [s.discarded_bytes for s in reader.sessions] == [None, len(torn)]


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


def test_writer_killed_between_overwrite_and_cut_leaves_the_rest_for_the_next(run: RunContext) -> None:
    """State a kill after the overwrite and before the truncate leaves: the next session cuts and reports the rest."""
    with MetricsWriter(run) as writer:
        writer.write("session_start", TrainingState(), discarded_bytes=0)
    torn = b'{"schema_version":1,"event":"train","note":"' + b"q" * 500
    with MetricsWriter(RunContext(run.directory, "exp1", "s2")) as writer:
        line = orjson.dumps(writer.record("session_start", TrainingState(), {"discarded_bytes": len(torn)})) + b"\n"
    # What the killed writer left: its first line written over the tail, the tail's rest not yet cut.
    with open(writer.path, "ab") as out:
        out.write(line + torn[len(line) :])
    rest = len(torn) - len(line)
    with MetricsWriter(RunContext(run.directory, "exp1", "s3")) as writer:
        assert writer.discarded_bytes == rest
        writer.write("session_start", TrainingState(), discarded_bytes=writer.discarded_bytes)
    reader = RunReader(writer.path)
    reader.refresh()
    assert [(s.session_id, s.discarded_bytes) for s in reader.sessions] == [
        ("s1", 0),
        ("s2", len(torn)),
        ("s3", rest),
    ]
    assert reader.bad_lines == 0 and reader.pending_bytes == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float32("nan"), np.float64("-inf")], ids=repr)
def test_nan_and_infinity_are_refused_and_nothing_is_written(run: RunContext, bad: float) -> None:
    """NaN/Inf raise ValueError naming the key; the file stays byte-identical."""
    with MetricsWriter(run) as writer:
        writer.write("train", TrainingState(step=1), train_loss=1.0)
        before = writer.path.read_bytes()
        with pytest.raises(ValueError, match="'grad_norm_max'"):
            writer.write("train", TrainingState(step=2), train_loss=1.0, grad_norm_max=bad)
        assert writer.path.read_bytes() == before


@pytest.mark.parametrize(
    ("bad", "type_name"),
    [
        ([1.0], "list"),
        ({"a": 1}, "dict"),
        (object(), "object"),
        (np.array([1.0, 2.0]), "ndarray"),
        (b"x", "bytes"),
    ],
)
def test_non_scalar_values_are_refused(run: RunContext, bad: object, type_name: str) -> None:
    """A value that is not a JSON scalar raises TypeError naming key and type; nothing written."""
    with MetricsWriter(run) as writer:
        with pytest.raises(TypeError, match=rf"'loss_parts' has type .*{type_name}"):
            writer.write("train", TrainingState(), loss_parts=bad)
    assert writer.path.read_bytes() == b""


@pytest.mark.parametrize("key", ["step", "time", "event", "session_id", "schema_version"])
def test_keys_colliding_with_base_fields_are_refused(run: RunContext, key: str) -> None:
    """A value may not overwrite a base field."""
    with MetricsWriter(run) as writer:
        with pytest.raises(RecordValueError, match=key):
            writer.write("train", TrainingState(), **{key: 1})
    assert writer.path.read_bytes() == b""


def test_numpy_scalars_are_written_as_plain_json(run: RunContext) -> None:
    """numpy scalars are unwrapped, so the line is standard JSON with the same values."""
    with MetricsWriter(run) as writer:
        record = writer.write(
            "train", TrainingState(), a=np.float32(0.5), b=np.int64(3), c=np.bool_(True), d=np.str_("x")
        )
    assert read_records(writer.path) == [record]
    assert (record["a"], record["b"], record["c"], record["d"]) == (0.5, 3, True, "x")


def test_config_record_holds_the_nested_hyperparameters(run: RunContext) -> None:
    """write_config appends one 'config' record whose nested value reads back as plain JSON."""
    config = {
        "model": {"layers": 12, "dims": [768, 3072], "act": "gelu", "tied": True, "dropout": None},
        "optim": {"name": "adamw", "lr": np.float32(0.5), "betas": (0.9, 0.95), "steps": np.int64(10)},
        "data": [{"path": "a.bin", "weight": 0.7}, {"path": "b.bin", "weight": 0.3}],
        "seed": 1,
    }
    with MetricsWriter(run) as writer:
        writer.write("session_start", TrainingState())
        returned = writer.write_config(TrainingState(step=5), config)
    _, on_disk = read_records(writer.path)
    assert on_disk == returned
    assert on_disk["event"] == "config" and on_disk["step"] == 5 and list(on_disk)[-1] == "config"
    assert on_disk["config"] == {
        "model": {"layers": 12, "dims": [768, 3072], "act": "gelu", "tied": True, "dropout": None},
        "optim": {"name": "adamw", "lr": 0.5, "betas": [0.9, 0.95], "steps": 10},
        "data": [{"path": "a.bin", "weight": 0.7}, {"path": "b.bin", "weight": 0.3}],
        "seed": 1,
    }
    assert type(on_disk["config"]["optim"]["steps"]) is int


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        ({"optim": {"lr": math.nan}}, RecordValueError, r"config\['optim'\]\['lr'\] is nan"),
        ({"optim": {"betas": [0.9, np.float64("inf")]}}, RecordValueError, r"config\['optim'\]\['betas'\]\[1\] is inf"),
        ({"model": {3: "x"}}, RecordTypeError, r"config\['model'\] has the key 3 of type builtins\.int"),
        ({"tags": {"a", "b"}}, RecordTypeError, r"config\['tags'\] has type builtins\.set"),
        ({"w": np.zeros(3)}, RecordTypeError, r"config\['w'\] has type numpy\.ndarray"),
        ({"run": {"fn": print}}, RecordTypeError, r"config\['run'\]\['fn'\] has type"),
    ],
    ids=["nan", "inf-in-list", "int-key", "set", "ndarray", "function"],
)
def test_config_refuses_bad_values_naming_the_key_path(
    run: RunContext, config: dict, error: type[MetricsError], message: str
) -> None:
    """A bad key or value anywhere in the config is refused with its key path; nothing is written."""
    with MetricsWriter(run) as writer:
        writer.write("session_start", TrainingState())
        before = writer.path.read_bytes()
        with pytest.raises(error, match=message):
            writer.write_config(TrainingState(), config)
        assert writer.path.read_bytes() == before


def test_config_over_the_size_limit_is_refused(run: RunContext) -> None:
    """A config whose JSON exceeds MAX_CONFIG_BYTES is refused saying its size and the limit."""
    fits = {"vocab": "x" * (MAX_CONFIG_BYTES - len('{"vocab":""}'))}
    too_big = {"vocab": fits["vocab"] + "x"}
    with MetricsWriter(run) as writer:
        writer.write_config(TrainingState(), fits)
        before = writer.path.read_bytes()
        limit = rf"{MAX_CONFIG_BYTES + 1} bytes .* limit of {MAX_CONFIG_BYTES} bytes"
        with pytest.raises(RecordValueError, match=limit):
            writer.write_config(TrainingState(), too_big)
        assert writer.path.read_bytes() == before
    assert len(read_records(writer.path)) == 1


def test_config_that_contains_itself_is_refused(run: RunContext) -> None:
    """A reference cycle is a clear RecordValueError, not a RecursionError; nothing is written."""
    config: dict = {"a": {}}
    config["a"]["loop"] = config
    with MetricsWriter(run) as writer:
        with pytest.raises(RecordValueError, match="deeper than"):
            writer.write_config(TrainingState(), config)
        with pytest.raises(RecordTypeError, match="expected a mapping"):
            writer.write_config(TrainingState(), [("lr", 0.1)])
    assert writer.path.read_bytes() == b""


def test_write_config_outside_the_with_block_is_an_error(run: RunContext) -> None:
    """write_config, like write, refuses to run on a writer that is not open."""
    with pytest.raises(WriterStateError, match="outside"):
        MetricsWriter(run).write_config(TrainingState(), {"lr": 0.1})


def test_write_outside_the_with_block_is_an_error(run: RunContext) -> None:
    """Writing before opening or after closing raises instead of silently dropping the record."""
    writer = MetricsWriter(run)
    with pytest.raises(WriterStateError, match="outside"):
        writer.write("train", TrainingState())
    with writer:
        writer.write("train", TrainingState())
    with pytest.raises(WriterStateError):
        writer.write("train", TrainingState())
    assert len(read_records(writer.path)) == 1


def test_fsync_mode_writes_the_same_records(run: RunContext) -> None:
    """fsync=True changes durability, not content."""
    with MetricsWriter(run, fsync=True) as writer:
        writer.write("train", TrainingState(step=1), train_loss=1.0)
    assert read_records(writer.path)[0]["train_loss"] == 1.0


def test_injected_clock_sets_time(run: RunContext) -> None:
    """The time field comes from the clock passed in (ns since epoch), as ISO-8601 UTC with offset."""
    fixed = datetime.fromisoformat("2026-01-02T03:04:05.000006+00:00")
    ticks = iter([int(fixed.timestamp()) * 10**9 + 6_999, int(fixed.timestamp() + 1) * 10**9 + 123_456_789])
    with MetricsWriter(run, clock=lambda: next(ticks)) as writer:
        first = writer.write("train", TrainingState())
        second = writer.write("train", TrainingState())
    assert first["time"] == "2026-01-02T03:04:05.000006+00:00"
    assert second["time"] == "2026-01-02T03:04:06.123456+00:00"


def test_default_clock_is_now_in_utc(run: RunContext) -> None:
    """Without a clock the time is the current UTC time."""
    with MetricsWriter(run) as writer:
        record = writer.write("train", TrainingState())
    assert abs(datetime.fromisoformat(record["time"]).timestamp() - time.time()) < 5


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


def test_second_writer_in_the_same_process_is_refused(run: RunContext) -> None:
    """The lock belongs to the open file, so even this process cannot open the run twice."""
    with MetricsWriter(run):
        with pytest.raises(WriterLockedError):
            with MetricsWriter(RunContext(run.directory, "r", "twin")):
                pass


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


def test_a_healthy_run_has_a_blank_note_and_a_garbled_note_is_no_note(run: RunContext) -> None:
    """The pre-sized note is blank until a write fails; a note that does not parse never fails a run."""
    with MetricsWriter(run) as writer:
        writer.write("session_start", TrainingState(), discarded_bytes=0)
    note = run.directory / ".metrics.jsonl.failure"
    assert note.read_bytes() == b" " * 1023 + b"\n"
    reader = RunReader(writer.path)
    reader.refresh()
    assert write_failure(reader) is None
    size = writer.path.stat().st_size
    for garbled in (b'{"session_id":"s1","end":' + str(size).encode(), b"[]", b'{"end":"0","size":0}'):
        note.write_bytes(garbled.ljust(1024))
        assert write_failure(reader) is None
    assert run_status(reader, now=datetime.now(timezone.utc)) == "live"


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
