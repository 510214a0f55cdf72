"""A run resumed thousands of times: supersession equals its rule read literally, and the work of
opening the run grows with the sessions, not with their square."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from metrics_core.dashboard.figures.run_charts import chart_builders
from metrics_core.dashboard.store.snapshot import build_view
from metrics_core.dashboard.views.chart_specs import ChartOptions
from metrics_core.read import supersession
from metrics_core.read.run_reader import RunReader
from tests.support import append_records, base_record, read_run
from tests.support.reading import assert_replay_matches_the_masks, redone_by_oracle


def random_resumes(path: Path, sessions: int, seed: int) -> None:
    """``sessions`` sessions, each resuming at a random step (often back, sometimes far back),
    logging train windows and, some at their first step, validations."""
    rng = random.Random(seed)
    records, step = [], 0
    for index in range(sessions):
        step = max(0, step - rng.choice([0, 0, 5, 10, 30, 200]))
        session = f"s{index}"
        records.append(base_record(step, event="session_start", session=session))
        if rng.random() < 0.3:
            records.append(base_record(step, event="validation", session=session, val_loss=rng.random()))
        for _ in range(rng.randint(0, 6)):
            step += rng.choice([1, 5, 10])
            event = "validation" if rng.random() < 0.2 else "train"
            records.append(base_record(step, event=event, session=session, train_loss=rng.random(), tokens=100))
    append_records(path, *records)


@pytest.mark.parametrize("seed", range(6))
def test_supersession_equals_its_rule_read_literally(tmp_path: Path, seed: int) -> None:
    """Per row of every event, the session that redid it is the first later session that began below
    its step (or at it, having logged that event there first), O(rows × sessions) in the oracle;
    each session's replay accounting adds up those rows."""
    path = tmp_path / "r" / "metrics.jsonl"
    random_resumes(path, 60, seed)
    reader = read_run(path)
    for event in reader.events:
        np.testing.assert_array_equal(reader.redone_by(event), redone_by_oracle(reader, event))
    assert_replay_matches_the_masks(reader)


def one_record_sessions(path: Path, sessions: int, *, back: int) -> None:
    """One train window per session; each resumes ``back`` steps before its predecessor's window
    (superseding it), or, ``back`` 0, after it."""
    step, records = 10 * sessions if back else 0, []
    for index in range(sessions):
        step += -back if back else 10
        records.append(base_record(step, session=f"s{index}", train_loss=1.0, tokens=100))
    append_records(path, *records)


@pytest.mark.parametrize("back", [0, 1, 3], ids=["forward", "each redoes the last", "each further back"])
def test_opening_a_run_of_one_record_sessions_costs_work_linear_in_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, back: int
) -> None:
    """The snapshot and first chart of 2,000 and of 4,000 one-record sessions: the bisections that
    place rows among later sessions at most 2.2× as many for twice the sessions (a pass per pair of
    sessions would be 4×), one per-row supersession pass per event, not one per session, and one
    sweep over the sessions per event, shared by the masks and the replay accounting."""
    probes = {"bisect": 0, "sweeps": 0}
    for name in ("bisect_left", "bisect_right"):
        original = getattr(supersession, name)

        def counted(*args: object, _original: object = original) -> int:
            probes["bisect"] += 1
            return _original(*args)

        monkeypatch.setattr(supersession, name, counted)
    original_later = supersession._later

    def sweep(*args: object) -> object:
        probes["sweeps"] += 1
        return original_later(*args)

    monkeypatch.setattr(supersession, "_later", sweep)
    passes = []
    original_pass = supersession.redone_by_ranges
    monkeypatch.setattr(
        "metrics_core.read.run_reader.redone_by_ranges", lambda *a: passes.append(1) or original_pass(*a)
    )
    work = {}
    for count in (2_000, 4_000):
        path = tmp_path / f"r{count}" / "metrics.jsonl"
        one_record_sessions(path, count, back=back)
        probes["bisect"], probes["sweeps"], passes[:] = 0, 0, []
        reader = RunReader(path)
        reader.refresh()
        view = build_view("r", reader, "finished")
        next(iter(chart_builders(view, ChartOptions()).values()))()
        assert len(view.sessions) == count and (view.redone_by >= 0).sum() == (count - 1 if back else 0)
        assert len(passes) <= len(reader.events) and probes["sweeps"] <= len(reader.events)
        work[count] = probes["bisect"]
    assert work[4_000] <= 2.2 * work[2_000]
