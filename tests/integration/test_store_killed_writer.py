"""RunStore and a writer killed with SIGKILL: the run reads as crashed at the next refresh, not
after the heartbeat."""

from __future__ import annotations

import signal
from datetime import datetime, timezone
from pathlib import Path

from metrics_core.dashboard.store.run_store import RunStore
from tests.support import append_records, base_record, spawn_python

WRITER_THEN_WAIT = """
import sys, time
from metrics_core import MetricsWriter, RunContext, TrainingState
with MetricsWriter(RunContext(sys.argv[1], "r", "s1")) as writer:
    for step in (1, 2, 3):
        writer.write("train", TrainingState(step=step), train_loss=1.0)
    print("written", flush=True)
    time.sleep(600)
"""


def test_a_killed_writer_reads_crashed_at_the_next_refresh_not_after_the_heartbeat(tmp_path: Path) -> None:
    """A real writer holding its lock is live on the runs page; SIGKILLed, its run reads crashed at
    the very next runs page, though its last record is seconds old (the lock was seen held, so a
    free lock is a dead writer).  A file that no writer ever locked keeps the heartbeat rule."""
    writer = spawn_python(WRITER_THEN_WAIT, str(tmp_path / "r"))
    try:
        assert writer.stdout.readline().strip() == "written"
        append_records(
            tmp_path / "plain" / "metrics.jsonl",
            base_record(1, train_loss=1.0, time=datetime.now(timezone.utc).isoformat()),
        )
        store = RunStore(tmp_path, safety_interval=0.0)
        try:
            status = lambda: store.runs_table().set_index("run")["status"].to_dict()  # noqa: E731
            assert status() == {"r": "live", "plain": "live"}
            writer.send_signal(signal.SIGKILL)
            writer.wait(timeout=30)
            assert status() == {"r": "crashed", "plain": "live"}
        finally:
            store.close()
    finally:
        writer.kill()
        writer.wait()
