"""TensorBoard logdirs written by TensorBoard's own writer, imported as runs and read back through
the public reader: values equal to TensorBoard's reader, restarts as resumed sessions, re-imports
adding nothing, torn and corrupt files imported up to the damage."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

tensorboard = pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import SCALARS, TENSORS, EventAccumulator  # noqa: E402
from tensorboard.compat.proto.event_pb2 import Event  # noqa: E402
from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary  # noqa: E402
from tensorboard.summary import Writer  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

from metrics_core.errors import MetricsError  # noqa: E402
from metrics_core.imports.import_state import STATE_FILENAME  # noqa: E402
from metrics_core.imports.tag_mapping import destination  # noqa: E402
from metrics_core.imports.tensorboard_import import import_logdir  # noqa: E402
from metrics_core.read.run_reader import RunReader  # noqa: E402
from metrics_core.read.run_status import run_status  # noqa: E402

T0 = 1_700_000_000.0


def write_session(
    logdir: Path, steps: range, *, offset: float = 0.0, tags=("train/loss", "train/learning_rate")
) -> Path:
    """One writer process's event file: each tag at each step, wall time T0 + offset + step."""
    writer = Writer(str(logdir))
    for step in steps:
        for number, tag in enumerate(tags):
            writer.add_scalar(tag, 1.0 / (step + 2 + number), step, wall_time=T0 + offset + step)
    writer.close()
    return newest_event_file(logdir)


def newest_event_file(logdir: Path) -> Path:
    return max(logdir.glob("events.out.tfevents.*"), key=lambda path: path.stat().st_mtime_ns)


def frame_starts(data: bytes) -> list[int]:
    """The offset of each TFRecord frame of an event file (a u64 length, then length + 16 bytes)."""
    frames, offset = [], 0
    while offset < len(data):
        frames.append(offset)
        offset += int.from_bytes(data[offset : offset + 8], "little") + 16
    return frames


def reader_of(run_dir: Path) -> RunReader:
    reader = RunReader(run_dir)
    reader.refresh()
    return reader


def tensorboard_values(logdir: Path, tag: str) -> list[tuple[int, float]]:
    """What TensorBoard's own reader returns for ``tag``: (step, value) in file order."""
    accumulator = EventAccumulator(str(logdir), size_guidance={SCALARS: 0, TENSORS: 0})
    accumulator.Reload()
    if tag in accumulator.Tags()["scalars"]:
        return [(event.step, event.value) for event in accumulator.Scalars(tag)]
    return [(event.step, tensor_util.make_ndarray(event.tensor_proto).item()) for event in accumulator.Tensors(tag)]


def test_values_are_those_tensorboards_reader_returns(tmp_path: Path) -> None:
    """Every scalar of a logdir written by tensorboard.summary.Writer comes through as the float32
    TensorBoard stored, at its step, stamped with its wall time; nested directories keep their path."""
    logdir = tmp_path / "logs" / "group" / "run"
    write_session(logdir, range(0, 50, 5), tags=("train/loss", "train/learning_rate", "eval/accuracy"))
    report = import_logdir(tmp_path / "logs", tmp_path / "root")
    assert (report.runs, report.sessions, report.scalars) == (1, 1, 30)
    reader = reader_of(tmp_path / "root" / "group" / "run")
    train, validation = reader.frame("train"), reader.frame("validation")
    assert list(zip(train["step"], train["train_loss"], strict=True)) == tensorboard_values(logdir, "train/loss")
    assert list(zip(train["step"], train["lr"], strict=True)) == tensorboard_values(logdir, "train/learning_rate")
    assert list(zip(validation["step"], validation["eval/accuracy"], strict=True)) == tensorboard_values(
        logdir, "eval/accuracy"
    )
    assert train["time"].iloc[-1] == datetime.fromtimestamp(T0 + 45, timezone.utc)
    assert run_status(reader, now=datetime.now(timezone.utc)) == "finished"


def test_a_restart_is_a_session_whose_replayed_steps_supersede_the_earlier_ones(tmp_path: Path) -> None:
    """Two writer processes, the second resumed from step 60 after the first logged up to 90:
    two sessions, the effective history takes steps 60-90 from the second, 30 steps replayed."""
    logdir = tmp_path / "logs" / "run"
    write_session(logdir, range(0, 100, 10))
    write_session(logdir, range(60, 150, 10), offset=1000.0)
    import_logdir(tmp_path / "logs", tmp_path / "root")
    reader = reader_of(tmp_path / "root" / "run")
    sessions = reader.sessions
    assert [(s.first_step, s.last_step, s.resumed_from_step) for s in sessions] == [(0, 90, None), (60, 140, 60)]
    assert sessions[0].end_status is None and sessions[1].end_status == "finished"
    assert sessions[1].steps_replayed == 30
    effective = reader.effective("train")
    assert list(effective["step"]) == list(range(0, 150, 10))
    assert list(effective["session_id"].iloc[6:]) == [sessions[1].session_id] * 9
    assert effective["train_loss"].iloc[7] == pytest.approx(1.0 / 72, rel=1e-6)  # the second copy of step 70
    assert reader.lost_work().steps_replayed == 30


def test_importing_again_adds_nothing_and_then_only_what_is_new(tmp_path: Path) -> None:
    """A second import writes nothing; a restart written after it becomes one more session."""
    logdir = tmp_path / "logs" / "run"
    write_session(logdir, range(0, 50, 10))
    import_logdir(tmp_path / "logs", tmp_path / "root")
    metrics = tmp_path / "root" / "run" / "metrics.jsonl"
    before = metrics.read_bytes()
    again = import_logdir(tmp_path / "logs", tmp_path / "root")
    assert (again.scalars, again.records) == (0, 0)
    assert metrics.read_bytes() == before
    write_session(logdir, range(30, 80, 10), offset=500.0)
    third = import_logdir(tmp_path / "logs", tmp_path / "root")
    assert (third.sessions, third.scalars) == (1, 10)
    assert metrics.read_bytes().startswith(before)
    assert [s.first_step for s in reader_of(metrics.parent).sessions] == [0, 30]


def test_an_earlier_file_that_grows_after_a_restart_is_named_not_imported(tmp_path: Path) -> None:
    """Records added to an earlier event file once a later one's session began cannot join their
    session (a session's records stay contiguous): the report names the file, nothing is written."""
    logdir = tmp_path / "logs" / "run"
    earlier = write_session(logdir, range(5))
    write_session(logdir, range(3, 8), offset=100.0)
    import_logdir(tmp_path / "logs", tmp_path / "root")
    metrics = tmp_path / "root" / "run" / "metrics.jsonl"
    before = metrics.read_bytes()
    data = earlier.read_bytes()
    frames = frame_starts(bytes(data))
    with earlier.open("ab") as file:
        file.write(data[frames[-1] :])  # its last record once more: a complete, valid record
    report = import_logdir(tmp_path / "logs", tmp_path / "root")
    assert report.problems == 1 and f"{earlier}: grew after a later event file's session began" in report.notes[0]
    assert metrics.read_bytes() == before


def test_a_torn_last_record_imports_everything_before_it_and_names_the_offset(tmp_path: Path) -> None:
    """A writer killed mid-record: the complete records are imported, the report names the file
    and the offset, and with no session_end the run reads crashed."""
    logdir = tmp_path / "logs" / "run"
    path = write_session(logdir, range(10))
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    report = import_logdir(tmp_path / "logs", tmp_path / "root")
    assert report.scalars == 19 and report.problems == 1
    (note,) = report.notes
    assert str(path) in note and "torn" in note
    offset = int(note.split("at offset ")[1].split(" ")[0])
    assert f"{len(data) - 7 - offset} bytes at offset" in note and 0 < offset < len(data) - 7
    reader = reader_of(tmp_path / "root" / "run")
    assert list(reader.frame("train")["step"]) == list(range(10))
    assert reader.frame("train")["lr"].isna().iloc[-1]  # step 9's lr was the torn record
    assert reader.sessions[0].end_status is None
    assert run_status(reader, now=datetime.now(timezone.utc)) == "crashed"


def test_a_corrupt_record_stops_its_file_there(tmp_path: Path) -> None:
    """A flipped byte inside a record's payload fails its checksum: the records before it are
    imported, none after it, and the report says checksum at that record's offset."""
    logdir = tmp_path / "logs" / "run"
    path = write_session(logdir, range(10), tags=("loss",))
    data = bytearray(path.read_bytes())
    frames = frame_starts(bytes(data))
    bad = frames[6]  # the file_version record, then steps 0..4: the sixth scalar is broken
    data[bad + 14] ^= 0xFF
    path.write_bytes(bytes(data))
    report = import_logdir(tmp_path / "logs", tmp_path / "root")
    assert f"at offset {bad} are a record that fails its checksum" in report.notes[0]
    assert list(reader_of(tmp_path / "root" / "run").frame("train")["step"]) == [0, 1, 2, 3, 4]


def test_non_scalar_values_are_counted_and_skipped_once(tmp_path: Path) -> None:
    """Histograms and images beside the scalars are skipped and said once, with their count."""
    logdir = tmp_path / "logs" / "run"
    writer = EventFileWriter(str(logdir))
    for step in range(3):
        values = [
            Summary.Value(tag="loss", simple_value=0.5 + step),
            Summary.Value(tag="weights", histo=HistogramProto(min=0.0, max=1.0, num=2)),
            Summary.Value(tag="sample", image=Summary.Image(height=1, width=1)),
        ]
        writer.add_event(Event(wall_time=T0 + step, step=step, summary=Summary(value=values)))
    writer.close()
    report = import_logdir(tmp_path / "logs", tmp_path / "root")
    assert report.scalars == 3
    assert [line for line in report.lines() if "non-scalar" in line] == [
        "run: skipped 6 non-scalar values (histo: 3, image: 3)"
    ]
    assert list(reader_of(tmp_path / "root" / "run").frame("train")["train_loss"]) == [0.5, 1.5, 2.5]


def test_a_nan_loss_is_missing_and_marked_as_the_writer_marks_it(tmp_path: Path) -> None:
    """JSON has no NaN: the loss is written as null with ``nonfinite_loss``, counted in the report."""
    writer = EventFileWriter(str(tmp_path / "logs" / "run"))
    for step, loss in enumerate((0.5, float("nan"), 0.25)):
        value = Summary.Value(tag="loss", simple_value=loss)
        writer.add_event(Event(wall_time=T0 + step, step=step, summary=Summary(value=[value])))
    writer.close()
    report = import_logdir(tmp_path / "logs", tmp_path / "root")
    assert report.nonfinite == 1
    train = reader_of(tmp_path / "root" / "run").frame("train")
    assert train["train_loss"].iloc[0] == 0.5 and train["train_loss"].isna().iloc[1]
    assert list(train["nonfinite_loss"].fillna(False)) == [False, True, False]


def test_an_import_killed_before_saving_its_state_is_cut_back(tmp_path: Path) -> None:
    """Records past the state's end (an import killed between writing and saving) are cut before
    the next import writes them again: each record once."""
    logdir = tmp_path / "logs" / "run"
    write_session(logdir, range(5))
    import_logdir(tmp_path / "logs", tmp_path / "root")
    run_dir = tmp_path / "root" / "run"
    state = json.loads((run_dir / STATE_FILENAME).read_text())
    # The state as saved after steps 0 and 1 (the file's version record and two tags a step)...
    state["files"][0].update(records=5, offset=0)
    state["ended"] = False
    lines = (run_dir / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    state["metrics_end"] = len(b"".join(lines[:3]))  # ...and the records it had written then
    (run_dir / STATE_FILENAME).write_text(json.dumps(state))
    import_logdir(tmp_path / "logs", tmp_path / "root")
    reader = reader_of(run_dir)
    assert list(reader.frame("train")["step"]) == [0, 1, 2, 3, 4]
    assert reader.sessions[0].end_status == "finished"


def test_a_fifo_named_like_an_event_file_is_passed_over(tmp_path: Path) -> None:
    """A FIFO among the event files (opening it would wait for a writer forever) is not read."""
    logdir = tmp_path / "logs" / "run"
    write_session(logdir, range(3))
    os.mkfifo(logdir / "events.out.tfevents.0.fifo")
    assert import_logdir(tmp_path / "logs", tmp_path / "root").scalars == 6


def test_a_run_no_import_wrote_is_refused(tmp_path: Path) -> None:
    """A run directory holding a trainer's own metrics.jsonl is never written into."""
    write_session(tmp_path / "logs" / "run", range(3))
    (tmp_path / "root" / "run").mkdir(parents=True)
    (tmp_path / "root" / "run" / "metrics.jsonl").write_bytes(b"")
    with pytest.raises(MetricsError, match="no import wrote"):
        import_logdir(tmp_path / "logs", tmp_path / "root")


@pytest.mark.parametrize(
    ("tag", "where"),
    [
        ("loss", ("train", "train_loss")),
        ("train/loss", ("train", "train_loss")),
        ("train/learning_rate", ("train", "lr")),
        ("grad_norm", ("train", "grad_norm_avg")),
        ("eval/loss", ("validation", "val_loss")),
        ("validation/loss", ("validation", "val_loss")),
        ("eval/bleu", ("validation", "eval/bleu")),
        ("throughput", ("train", "throughput")),
        ("step", ("train", "imported/step")),
    ],
)
def test_tags_land_on_the_products_fields(tag: str, where: tuple[str, str]) -> None:
    """The names trainers log land on the default charts; others stay logged keys, base fields renamed."""
    assert destination(tag) == where


def test_only_the_import_command_reaches_tensorboard() -> None:
    """TensorBoard is imported by ``imports/event_files.py`` alone, and the imports package only by
    itself and its command: the training side and the dashboard never load either."""
    import ast

    from tests.support import REPO

    package = REPO / "metrics_core"
    importers: dict[str, set[str]] = {"tensorboard": set(), "metrics_core.imports": set()}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                for root in importers:
                    if name == root or name.startswith(root + "."):
                        importers[root].add(path.relative_to(package).as_posix())
    assert importers["tensorboard"] == {"imports/event_files.py"}
    assert {path for path in importers["metrics_core.imports"] if not path.startswith("imports/")} == {"cli/imports.py"}
