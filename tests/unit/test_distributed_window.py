"""The distributed side without a process group: rank health, the silent writer of ranks other
than 0, a previous job's rank failure, and a session that is single-process (the gloo jobs are in
tests/integration/test_distributed.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from metrics_core import RecordValueError, TrainingState
from metrics_core.write.distributed import SilentWriter, rank_health
from metrics_core.write.training_session import training_session
from metrics_core.write.writer import RunContext
from tests.support import read_records


def test_rank_0_ignores_a_previous_jobs_rank_failure(tmp_path: Path) -> None:
    """A note older than rank 0's process is a previous job's: rank 0's own SIGTERM is what ended this one."""
    from datetime import datetime, timedelta, timezone

    from metrics_core.write.distributed import RankFailure, leave_rank_failure, process_start_time, rank_failures

    started = process_start_time()
    assert started is not None and started <= datetime.now(timezone.utc)
    old = RankFailure(1, 4, started - timedelta(seconds=1), "ValueError: last job")
    new = RankFailure(3, 4, started + timedelta(microseconds=1), "RuntimeError: this job")
    for failure in (old, new):
        leave_rank_failure(tmp_path, failure)
    (tmp_path / ".metrics.rank-2.failure").write_bytes(b'{"rank": 2, "wor')  # torn: no note
    assert rank_failures(tmp_path, since=started, until=datetime.now(timezone.utc)) == [new]


def test_rank_health_ignores_ranks_without_attempts_and_breaks_ties_low() -> None:
    """NaN slots (no attempt) are skipped; the lowest rank wins a tie; global ranks are mapped."""
    health = rank_health([0.5, math.nan, 0.5, 0.1], [10.0, math.nan, 20.0, 50.0], lambda rank: rank + 8)
    assert (health.slowest_rank, health.step_time_max_s, health.step_time_min_s) == (8, 0.5, 0.1)
    assert (health.tokens_per_s_min, health.tokens_per_s_max, health.world_size) == (10.0, 50.0, 4)
    assert rank_health([math.nan], [math.nan], int).slowest_rank is None


def test_silent_writer_validates_like_the_writer_and_creates_nothing(tmp_path: Path) -> None:
    """What ranks ≠ 0 hold: same record, same refusals, no directory."""
    silent = SilentWriter(RunContext(tmp_path / "run", "run", "s"))
    record = silent.write("train", TrainingState(step=3), train_loss=1.5)
    assert (record["event"], record["step"], record["train_loss"]) == ("train", 3, 1.5)
    with pytest.raises(RecordValueError):
        silent.write("train", TrainingState(), train_loss=math.nan)
    assert silent.write_config(TrainingState(), {"optim": {"lr": 0.1}})["config"] == {"optim": {"lr": 0.1}}
    assert not (tmp_path / "run").exists()


def test_without_a_process_group_the_session_is_single_process(tmp_path: Path) -> None:
    """torch.distributed imported but not initialised: plain window, no rank fields, rank 0 writes."""
    import torch.distributed  # noqa: F401

    from metrics_core import TrainingWindow

    with training_session(tmp_path / "run") as session:
        assert type(session.window) is TrainingWindow and (session.rank, session.world_size) == (0, 1)
    start = read_records(tmp_path / "run" / "metrics.jsonl")[0]
    assert "rank" not in start and "world_size" not in start
