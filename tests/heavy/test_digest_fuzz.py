"""metrics_core.read.run_digest against RunReader on any resume layout hypothesis makes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import append_records, base_record
from tests.support.reading import (
    assert_agrees_with_reader,
)


@st.composite
def resumed_runs(draw: st.DrawFn) -> list[dict]:
    """Sessions resuming at arbitrary steps, relogging (or not) their first step, some interleaved."""
    records, clock = [], 0
    for session in range(draw(st.integers(1, 5))):
        step = draw(st.integers(0, 60))
        for _ in range(draw(st.integers(1, 8))):
            event = draw(st.sampled_from(["train", "train", "validation", "session_start", "session_end"]))
            clock += draw(st.integers(0, 3))
            tokens = draw(st.one_of(st.integers(0, 500), st.none(), st.just("many"), st.booleans()))
            record = base_record(step, event=event, session=f"s{draw(st.sampled_from([session, session, 0]))}",
                                 tokens=tokens, status=draw(st.sampled_from(["finished", "failed", 3])),
                                 discarded_bytes=draw(st.sampled_from([0, 17, None, 2.5])))  # fmt: skip
            record["time"] = (datetime(2026, 11, 29, tzinfo=timezone.utc) + timedelta(seconds=clock)).isoformat()
            records.append(record)
            step += draw(st.integers(-5, 20))
    return records


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=resumed_runs())
def test_any_resume_layout_agrees_with_run_reader(tmp_path: Path, records: list[dict]) -> None:
    """Supersession, replay and lost work equal RunReader's for resumes at any step, steps going back, interleaving."""
    path = tmp_path / "fuzz" / "metrics.jsonl"
    path.unlink(missing_ok=True)
    append_records(path, *records)
    assert_agrees_with_reader(path, datetime(2026, 11, 29, 0, 5, tzinfo=timezone.utc))
