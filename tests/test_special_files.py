"""Processes that share a writer by forking: a forked child that writes through its parent's
writer is refused on its first write, and nothing either process had written is lost.  Real
forked processes, read back through the public reader.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import orjson
import pytest

from metrics_core import RunContext
from metrics_core.errors import MetricsError, WriterLockedError
from metrics_core.reader import RunReader
from metrics_core.writer import MetricsWriter, TrainingState
from tests.support import read_records

# -- forked writers --------------------------------------------------------------------------------

_INHERITED: MetricsWriter | None = None  # the parent's open writer, as a forked pool worker inherits it


def _log_from_worker(step: int) -> str:
    """In a forked pool worker: write through the inherited writer; say what happened."""
    try:
        _INHERITED.write("train", TrainingState(step=step), train_loss=9.0, worker=os.getpid())
    except MetricsError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "written"


def written(path: Path) -> list[tuple[int, float]]:
    """(step, train_loss) of every train record, read back through the public reader (no bad line)."""
    reader = RunReader(path)
    reader.refresh()
    assert reader.bad_lines == 0 and reader.pending_bytes == 0
    frame = reader.frame("train")
    return list(zip(frame["step"].tolist(), frame["train_loss"].tolist(), strict=True))


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


def test_multiprocessing_workers_forked_from_a_writer_are_refused_and_lose_nothing(run: RunContext) -> None:
    """A fork-started pool logging through the inherited writer: each worker is refused, no record is lost."""
    global _INHERITED
    acknowledged = []
    with MetricsWriter(run) as writer:
        writer.write("train", TrainingState(step=1), train_loss=1.0)
        acknowledged.append((1, 1.0))
        _INHERITED = writer
        try:
            with multiprocessing.get_context("fork").Pool(2) as pool:
                answers = pool.map(_log_from_worker, range(10, 30))
        finally:
            _INHERITED = None
        for step in range(2, 12):
            writer.write("train", TrainingState(step=step), train_loss=1.0)
            acknowledged.append((step, 1.0))
    acknowledged += [(step, 9.0) for step, answer in zip(range(10, 30), answers, strict=True) if answer == "written"]
    assert sorted(written(writer.path)) == sorted(acknowledged)
    assert all(answer.startswith("WriterForkedError: ") for answer in answers), answers


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
