"""examples/train_torch.py for real: SIGKILL mid-training, rerun, and read two sessions with a replay."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from metrics_core.analysis.diagnostics import diagnose_reader
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import run_status
from tests.support import REPO

pytest.importorskip("torch", reason="the PyTorch CPU build is not installed (.ci/run: pip install torch==2.13.0)")

EXAMPLE = str(REPO / "examples" / "train_torch.py")


def last_step(run: Path) -> int:
    if not (run / "metrics.jsonl").exists():
        return 0
    reader = RunReader(run)
    reader.refresh()
    return reader.sessions[-1].last_step if reader.sessions else 0


def test_killed_and_rerun_reads_as_two_sessions_with_a_replay(tmp_path: Path) -> None:
    """Kill after the second checkpoint, rerun to the end: the resume redid exactly the lost steps."""
    run = tmp_path / "runs" / "char"
    first = subprocess.Popen([sys.executable, EXAMPLE, str(run), "--steps", "300", "--sleep", "0.01"])
    deadline = time.monotonic() + 120
    while last_step(run) < 130 and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    subprocess.run([sys.executable, EXAMPLE, str(run), "--steps", "300"], check=True, timeout=300)

    reader = RunReader(run)
    reader.refresh()
    s1, s2 = reader.sessions
    checkpoints = reader.frame("checkpoint")
    saved = checkpoints[checkpoints["session_id"] == s1.session_id]["step"].tolist()
    assert s1.end_status is None and s2.end_status == "finished"
    assert s1.last_step >= 130 and saved and saved == sorted(saved)
    assert s2.resumed_from_step == s2.first_step and s2.resumed_from_step % 50 == 0
    assert saved[-1] <= s2.resumed_from_step <= s1.last_step
    assert s2.steps_replayed == s1.last_step - s2.resume_step
    assert s2.records_superseded >= (s1.last_step - s2.resume_step) // 10
    effective = reader.effective("train")
    assert effective["step"].tolist() == list(range(10, 301, 10))
    first_losses = effective["train_loss"].to_numpy()
    assert np.mean(first_losses[-5:]) < np.mean(first_losses[:5])
    assert run_status(reader, now=reader.last_record_time) == "finished"
    assert not [f for f in diagnose_reader(reader) if f.severity == "error"]
