"""``python -m metrics_core import tensorboard`` as a real process: a logdir torch's SummaryWriter
wrote across a restart, and ``--follow`` beside a live TensorBoard writer, stopped by SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from tensorboard.summary import Writer

from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import run_status

DEADLINE_S = 30.0


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metrics_core", *args], capture_output=True, text=True,
                          timeout=120, cwd="/")  # fmt: skip


def reader_of(run_dir: Path) -> RunReader:
    reader = RunReader(run_dir)
    reader.refresh()
    return reader


def wait_for(predicate, timeout: float = DEADLINE_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout} s")


def test_a_restarted_torch_run_imports_as_two_sessions_with_tensorboards_values(tmp_path: Path) -> None:
    """Two SummaryWriter processes on one log_dir (the second resumed at step 60), a histogram
    beside the scalars: two sessions, values equal to EventAccumulator's, the histogram said once."""
    torch = pytest.importorskip("torch")
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path / "tb" / "bert"
    first = SummaryWriter(str(logdir))
    for step in range(0, 100, 10):
        first.add_scalar("train/loss", 2.0 / (step + 1), step)
        first.add_scalar("train/learning_rate", 1e-4 * (step + 1), step)
    first.add_histogram("weights", torch.arange(5.0), 50)
    first.close()
    second = SummaryWriter(str(logdir))
    for step in range(60, 130, 10):
        second.add_scalar("train/loss", 1.9 / (step + 1), step)
    second.close()

    done = cli("import", "tensorboard", str(tmp_path / "tb"), str(tmp_path / "root"))
    assert done.returncode == 0, done.stderr
    assert "bert: skipped 1 non-scalar values (histo: 1)" in done.stdout
    reader = reader_of(tmp_path / "root" / "bert")
    assert [(s.first_step, s.resumed_from_step, s.end_status) for s in reader.sessions] == [
        (0, None, None),
        (60, 60, "finished"),
    ]
    accumulator = EventAccumulator(str(logdir), size_guidance={SCALARS: 0})
    accumulator.Reload()
    train = reader.frame("train")  # every session's records, superseded ones included, in file order
    assert list(zip(train["step"], train["train_loss"], strict=True)) == [
        (event.step, event.value) for event in accumulator.Scalars("train/loss")
    ]
    assert list(reader.effective("train")["step"]) == list(range(0, 130, 10))
    again = cli("import", "tensorboard", str(tmp_path / "tb"), str(tmp_path / "root"))
    assert again.returncode == 0 and again.stdout.startswith("imported 0 scalars as 0 records")


def test_follow_imports_a_live_writer_and_a_restart_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """--follow: each flush of a live tensorboard.summary.Writer shows up, the run reads live (the
    importer holds its lock), a restart becomes a second session; SIGTERM ends the import with
    exit status 0, the last session ended and the lock released."""
    logdir, run_dir = tmp_path / "tb" / "live", tmp_path / "root" / "live"
    writer = Writer(str(logdir))
    writer.add_scalar("loss", 1.0, 0)
    writer.flush()
    follower = subprocess.Popen(
        [sys.executable, "-m", "metrics_core", "import", "tensorboard", str(tmp_path / "tb"), str(tmp_path / "root"),
         "--follow", "--interval", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )  # fmt: skip
    try:
        wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(reader_of(run_dir).frame("train")) == 1)
        for step in (1, 2, 3):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.flush()
        reader = wait_for(lambda: next((r for r in [reader_of(run_dir)] if len(r.frame("train")) == 4), None))
        assert run_status(reader, now=datetime.now(timezone.utc)) == "live"
        writer.close()
        restarted = Writer(str(logdir))
        restarted.add_scalar("loss", 0.9, 2)
        restarted.add_scalar("loss", 0.8, 3)
        restarted.flush()
        wait_for(lambda: len(reader_of(run_dir).frame("train")) == 6)
        restarted.close()
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=DEADLINE_S)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert out.startswith("imported 6 scalars as 6 records in 2 new sessions of 1 runs")
    reader = reader_of(run_dir)
    assert [(s.first_step, s.resumed_from_step, s.end_status) for s in reader.sessions] == [
        (0, None, None),
        (2, 2, "finished"),
    ]
    assert reader.writer_alive() is False
    assert list(reader.effective("train")["train_loss"]) == [1.0, 0.5, 0.8999999761581421, 0.800000011920929]
