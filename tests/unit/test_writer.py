"""MetricsWriter in this process: record format, tail recovery, refusal of bad input, locking (real
crashes are in tests/integration/test_writer_processes.py)."""

from __future__ import annotations

import math
import time
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
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import run_status, write_failure
from metrics_core.write.writer import MAX_CONFIG_BYTES
from tests.support import read_records


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


def test_second_writer_in_the_same_process_is_refused(run: RunContext) -> None:
    """The lock belongs to the open file, so even this process cannot open the run twice."""
    with MetricsWriter(run):
        with pytest.raises(WriterLockedError):
            with MetricsWriter(RunContext(run.directory, "r", "twin")):
                pass


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
    # The writer is gone without a session_end: crashed, not failed by a note that does not parse.
    assert run_status(reader, now=datetime.now(timezone.utc)) == "crashed"
