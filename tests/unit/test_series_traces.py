"""A series' steps to its traces, each alone (values, pick points, name, mark gaps, hover), and the
downsampler chosen by the chart's caller: the figure draws the points it is handed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from metrics_core.analysis.downsample import minmax_indices
from metrics_core.dashboard.figures.layout import MIN_TRACE_POINTS, SUPERSEDED_OPACITY, TRACE_POINTS, session_colour
from metrics_core.dashboard.figures.metric_figures import metric_figure
from metrics_core.dashboard.figures.run_charts import run_charts
from metrics_core.dashboard.figures.series_traces import (
    KEY_COLOUR,
    gap_trace,
    hover,
    lone,
    missing_rows,
    part_look,
    pick_points,
    series_data,
    series_parts,
    series_values,
    trace_budget,
)
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.views.chart_specs import ChartOptions, Series
from tests.support import append_records, base_record, rank_window


def _frame(rows: int, sessions: int = 1) -> pd.DataFrame:
    codes = np.repeat(np.arange(sessions), -(-rows // sessions))[:rows]
    return pd.DataFrame(
        {
            "step": np.arange(rows) * 10,
            "session_id": pd.Categorical.from_codes(codes, [f"s{i}" for i in range(sessions)]),
            "loss": np.linspace(5.0, 1.0, rows),
        }
    )


def _every_tenth(values: np.ndarray, max_points: int) -> np.ndarray:
    """A downsampler no trace code knows of: a plain stride."""
    return np.arange(0, len(values), 10)


def test_values_are_floats_and_an_event_count_only_where_it_happened() -> None:
    assert np.array_equal(series_values(pd.Series([1, 2, 3]), events=False), [1.0, 2.0, 3.0])
    coerced = series_values(pd.Series(["1.5", "x", None], dtype=object), events=False)
    assert coerced[0] == 1.5 and np.isnan(coerced[1:]).all()
    events = series_values(pd.Series([0, 2, 0, 1]), events=True)
    assert np.isnan(events[[0, 2]]).all() and events[1] == 2 and events[3] == 1


def test_pick_points_draws_what_the_downsampler_picks_within_the_trace_budget() -> None:
    values = np.arange(100.0)
    assert np.array_equal(pick_points(values, 5, _every_tenth), np.arange(0, 100, 10))
    assert np.array_equal(pick_points(values, 4000, minmax_indices), np.arange(100))
    assert trace_budget(0.0, 10) == MIN_TRACE_POINTS
    assert trace_budget(1.0, 10**9) == TRACE_POINTS
    assert trace_budget(0.5, 2 * MIN_TRACE_POINTS + 2) == MIN_TRACE_POINTS + 1


def test_the_chart_draws_the_points_its_caller_s_downsampler_chose() -> None:
    """``metric_figure`` and the run page's ``run_charts`` take the downsampler: a stride passed in
    is what each line holds, and without one the chart's lines are min/max's."""
    frame = _frame(20_000)
    series = [Series(frame, "loss", "loss", colour="#123456")]
    figure = metric_figure(series, title="t", sessions=[], downsample=_every_tenth)
    line = next(trace for trace in figure["data"] if trace.get("name") == "loss")
    assert np.array_equal(line["x"], np.arange(0, 20_000, 10) * 10)
    default = metric_figure(series, title="t", sessions=[], max_points=500)
    line = next(trace for trace in default["data"] if trace.get("name") == "loss")
    picked = minmax_indices(frame["loss"].to_numpy(), trace_budget(500 / 20_000, 20_000))
    assert len(picked) < 20_000 and np.array_equal(line["x"], frame["step"].to_numpy()[picked])


def test_run_charts_pass_their_downsampler_to_every_line(tmp_path: Path) -> None:
    append_records(
        tmp_path / "run" / "metrics.jsonl", *(base_record(s, train_loss=1.0 + 1.0 / s) for s in range(10, 5_001, 10))
    )
    store = RunStore(tmp_path)
    try:
        picked: list[int] = []

        def counting(values: np.ndarray, max_points: int) -> np.ndarray:
            picked.append(len(values))
            return np.arange(0, len(values), 7)

        figures = run_charts(store.view("run"), ChartOptions(), downsample=counting)
        assert picked, "no line was downsampled by the caller's choice"
        loss = figures["loss"]["data"]
        drawn = [trace for trace in loss if len(trace.get("x", ())) > 1]
        assert drawn and all(len(trace["x"]) == len(range(0, 500, 7)) for trace in drawn)
    finally:
        store.close()


def test_the_straggler_band_is_picked_by_the_caller_s_downsampler_too(tmp_path: Path) -> None:
    append_records(tmp_path / "run" / "metrics.jsonl", *(rank_window(s) for s in range(10, 20_001, 10)))
    store = RunStore(tmp_path)
    try:
        asked: list[int] = []

        def stride(values: np.ndarray, max_points: int) -> np.ndarray:
            asked.append(len(values))
            return np.arange(0, len(values), 50)

        figure = run_charts(store.view("run"), ChartOptions(), downsample=stride)["straggler"]
        assert asked and [len(trace.get("x", ())) for trace in figure["data"]] == [40, 40, 40]  # band edges, ratio
    finally:
        store.close()


def test_parts_are_each_session_effective_then_superseded() -> None:
    frame = _frame(30, sessions=3)
    superseded = np.zeros(30, dtype=bool)
    superseded[8:10] = True
    data = series_data(Series(frame, "loss", "loss", superseded=superseded), 0, x="step", origin=None, smoothing=0.0)
    assert data is not None
    parts = [(code, dimmed, rows.tolist()) for code, dimmed, rows in series_parts(data, every_session=False)]
    assert parts == [
        (0, False, list(range(8))),
        (0, True, [8, 9]),
        (1, False, list(range(10, 20))),
        (2, False, list(range(20, 30))),
    ]
    every = [(code, dimmed, len(rows)) for code, dimmed, rows in series_parts(data, every_session=True)]
    assert every == [(-1, False, 28), (-1, True, 2)]
    assert series_data(Series(frame, "absent", "x"), 0, x="step", origin=None, smoothing=0.0) is None


def test_a_part_is_named_and_coloured_by_its_session_and_whether_it_was_redone() -> None:
    frame = _frame(10)
    data = series_data(Series(frame, "loss", "a <b>loss</b>"), 0, x="step", origin=None, smoothing=0.0)
    assert data is not None
    look = part_look(data, 1, dimmed=True)
    assert look.name == "a &lt;b&gt;loss&lt;/b&gt; · S2 (superseded)" and look.where == look.name
    assert look.colour == session_colour(1) and look.opacity == SUPERSEDED_OPACITY
    every = part_look(data, -1, dimmed=False)
    assert every.suffix == " · every session" and every.colour == KEY_COLOUR and every.opacity == 1.0
    coloured = series_data(Series(frame, "loss", "run-a", colour="#123456"), 0, x="step", origin=None, smoothing=0.0)
    assert coloured is not None
    own = part_look(coloured, 0, dimmed=False)
    assert (own.name, own.suffix, own.colour) == ("run-a", "", "#123456")


def test_hover_names_the_value_and_the_step_only_when_x_is_not_the_step() -> None:
    assert hover("loss · S1", ".4g", at_step=False) == "loss · S1: %{y:.4g}<extra></extra>"
    assert hover("loss", ".4g", at_step=True) == "loss: %{y:.4g} · step %{customdata:,}<extra></extra>"


def test_gaps_are_marked_sampled_within_budget_and_lone_values_found() -> None:
    values = np.where(np.arange(1000) % 2 == 0, np.nan, 1.0)
    rows = np.arange(1000) + 5_000
    missing = missing_rows(rows, values, 50)
    assert len(missing) <= 50 and missing[0] == 5_000 and missing[-1] == 5_998
    assert np.isin(missing, rows[np.isnan(values)]).all() and np.all(np.diff(missing) > 0)
    assert missing_rows(rows[:10], values[:10], 50).tolist() == [5_000, 5_002, 5_004, 5_006, 5_008]
    assert lone(np.array([np.nan, 1.0, np.nan, 2.0, 3.0, np.nan, 4.0])).tolist() == [
        False, True, False, False, False, False, True,
    ]  # fmt: skip
    frame = _frame(10)
    data = series_data(Series(frame, "loss", "loss"), 0, x="step", origin=None, smoothing=0.0)
    assert data is not None
    trace = gap_trace(np.array([3.0, 7.0]), part_look(data, 0, dimmed=False), first=True)
    assert trace["yaxis"] == "y3" and trace["showlegend"] and trace["name"] == "no successful update · S1"
    assert trace["y"].tolist() == [0.03, 0.03]
