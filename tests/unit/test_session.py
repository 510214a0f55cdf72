"""training_session: start and end records however the block ends (real signals are in
tests/integration/test_session_signals.py)."""

from __future__ import annotations

import os
import signal
from datetime import datetime, timezone
from pathlib import Path

import pytest

from metrics_core import RecordValueError, TrainingState
from metrics_core.write.training_session import new_session_id, training_session
from tests.support import append_bytes, read_records


def test_finished_session_logs_start_windows_and_end(tmp_path: Path) -> None:
    """A completed block: session_start, train windows that advance the counters, session_end finished."""
    with training_session(tmp_path / "run") as session:
        for attempt in range(20):
            session.window.add(2.0, 100, 0.5, attempt == 3, 1.0)
            if session.window.attempts == 10:
                session.log_window(1e-3)
        session.log_validation(1.5, 400)
        session.log_checkpoint("ckpt.pt")
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert [r["event"] for r in records] == [
        "session_start",
        "train",
        "train",
        "validation",
        "checkpoint",
        "session_end",
    ]
    assert records[0]["discarded_bytes"] == 0 and records[0]["resumed_from_step"] is None
    assert (records[1]["step"], records[1]["skipped_updates"], records[1]["tokens_seen"]) == (9, 1, 1000)
    assert (records[2]["step"], records[2]["tokens_seen"]) == (19, 2000)
    assert records[-1]["status"] == "finished" and records[0]["run_id"] == "run"


def test_failed_session_logs_the_exception_and_reraises_it(tmp_path: Path) -> None:
    """An exception is recorded with its type and message, and still propagates."""
    with pytest.raises(ZeroDivisionError), training_session(tmp_path / "run"):
        1 / 0  # noqa: B018
    end = read_records(tmp_path / "run" / "metrics.jsonl")[-1]
    assert (end["status"], end["error"]) == ("failed", "ZeroDivisionError: division by zero")


def test_keyboard_interrupt_is_interrupted(tmp_path: Path) -> None:
    """Ctrl-C is an interruption, not a failure, and still propagates."""
    with pytest.raises(KeyboardInterrupt), training_session(tmp_path / "run"):
        raise KeyboardInterrupt
    assert read_records(tmp_path / "run" / "metrics.jsonl")[-1]["status"] == "interrupted"


def test_sys_exit_is_finished_and_an_exit_signal_subclass_is_not(tmp_path: Path) -> None:
    """sys.exit() in the block ends finished; a SystemExit subclass (Lightning's SIGTERMException) failed."""

    class ExitSignal(SystemExit):
        pass

    for name, exit_with in (("plain", SystemExit(0)), ("signal", ExitSignal())):
        with pytest.raises(SystemExit), training_session(tmp_path / name):
            raise exit_with
    assert read_records(tmp_path / "plain" / "metrics.jsonl")[-1]["status"] == "finished"
    end = read_records(tmp_path / "signal" / "metrics.jsonl")[-1]
    assert (end["status"], end["error"]) == ("failed", "ExitSignal: ")


def test_resume_records_discarded_bytes_and_checkpoint_step(tmp_path: Path) -> None:
    """A session opened over a torn tail says how many bytes were cut and where it resumed."""
    with training_session(tmp_path / "run", session_id="a"):
        pass
    append_bytes(tmp_path / "run" / "metrics.jsonl", b'{"schema_version":1,"ev')
    with training_session(tmp_path / "run", session_id="b", state=TrainingState(step=40), resumed_from_step=40):
        pass
    start = next(r for r in read_records(tmp_path / "run" / "metrics.jsonl") if r["session_id"] == "b")
    assert (start["discarded_bytes"], start["resumed_from_step"], start["step"]) == (23, 40, 40)


def test_session_ids_are_unique_and_sort_by_start_time() -> None:
    """Generated ids order like their start times."""
    early = new_session_id(datetime(2026, 1, 1, tzinfo=timezone.utc))
    late = new_session_id(datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=timezone.utc))
    assert early < late and early.startswith("20260101T000000000000Z-")
    assert early.endswith(f"-{os.getpid()}")


def test_sigterm_handler_is_only_ours_inside_the_block(tmp_path: Path) -> None:
    """The previous SIGTERM handler is back once the session ends."""
    before = signal.getsignal(signal.SIGTERM)
    with training_session(tmp_path / "run"):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


def test_config_is_logged_once_right_after_session_start(tmp_path: Path) -> None:
    """training_session(config=...) writes one nested config record right after session_start."""
    with training_session(tmp_path / "run", config={"optim": {"lr": 3e-4, "betas": [0.9, 0.95]}, "seed": 1}):
        pass
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert [r["event"] for r in records] == ["session_start", "config", "session_end"]
    assert records[1]["config"] == {"optim": {"lr": 3e-4, "betas": [0.9, 0.95]}, "seed": 1}


def test_refused_config_ends_the_session_failed(tmp_path: Path) -> None:
    """A config the writer refuses (NaN) propagates, and the session still gets its end record."""
    with pytest.raises(RecordValueError), training_session(tmp_path / "run", config={"lr": float("nan")}):
        pass
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert [r["event"] for r in records] == ["session_start", "session_end"]
    assert records[-1]["status"] == "failed"
