"""training_session in a real process: SIGTERM from the scheduler ends the session interrupted;
SIGKILL leaves no session end and the run reads as crashed."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta, timezone
from pathlib import Path

from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import run_status
from tests.support import read_records, spawn_python

SIGTERMED = """
import sys, time
from metrics_core.write.training_session import training_session
with training_session(sys.argv[1]) as session:
    session.log("heartbeat")
    print("running", flush=True)
    time.sleep(60)
"""


def test_sigterm_from_the_scheduler_is_interrupted(tmp_path: Path) -> None:
    """A real SIGTERM ends the session as interrupted and the process exits with status 143."""
    child = spawn_python(SIGTERMED, str(tmp_path / "run"))
    assert child.stdout.readline().strip() == "running"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=20) == 143
    end = read_records(tmp_path / "run" / "metrics.jsonl")[-1]
    assert (end["event"], end["status"], end["error"]) == ("session_end", "interrupted", "SIGTERM")


def test_sigkill_leaves_no_session_end_and_reads_as_crashed(tmp_path: Path) -> None:
    """SIGKILL cannot be caught: the session has no end record, which is how a crash is recognised."""
    child = spawn_python(SIGTERMED, str(tmp_path / "run"))
    assert child.stdout.readline().strip() == "running"
    child.kill()
    child.wait()
    reader = RunReader(tmp_path / "run")
    reader.refresh()
    assert reader.sessions[0].end_status is None and reader.last_event == "heartbeat"
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    assert run_status(reader, now=later) == "crashed"
