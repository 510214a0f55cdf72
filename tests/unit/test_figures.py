"""Figure functions and downsampling, tested without a server: data in, plotly figure out."""

from __future__ import annotations

import io
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from metrics_core.analysis.downsample import minmax_indices
from metrics_core.dashboard.figures.figure_dicts import figure_json
from metrics_core.dashboard.figures.layout import NO_TEMPLATE, SESSION_COLOURS, SUPERSEDED_OPACITY
from metrics_core.dashboard.figures.metric_figures import metric_figure
from metrics_core.dashboard.figures.rank_figures import out_of_lockstep, straggler_figure
from metrics_core.dashboard.figures.run_charts import compare_chart, run_charts
from metrics_core.dashboard.figures.series_traces import MARKED_POINTS, ema_smooth
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.views.chart_csv import CSV_PIECE_ROWS, chart_csv_pieces_of
from metrics_core.dashboard.views.chart_filter import FILTER_MAX_CHARS
from metrics_core.dashboard.views.chart_specs import (
    HISTORY_MODES,
    MAX_LOGGED_CHARTS,
    STRAGGLER_TITLE,
    ChartOptions,
    Series,
    charts_of,
    grouped_figures,
    pick_charts,
    rank_time_ratio,
)
from metrics_core.dashboard.views.compare import compare_metrics
from metrics_core.read.run_reader import RunReader
from tests.support import append_records, base_record, distributed_run, rank_window, small_run, three_session_run


@pytest.fixture
def reader(tmp_path: Path) -> RunReader:
    path = tmp_path / "run" / "metrics.jsonl"
    three_session_run(path)
    reader = RunReader(path)
    reader.refresh()
    return reader


def traces(figure, prefix: str) -> list:
    return [trace for trace in figure.data if trace.name and trace.name.startswith(prefix)]


def test_session_boundaries_are_labelled_lines_at_resume_steps(reader: RunReader) -> None:
    """Each later session starts with a dashed vertical line labelled with its number and resume step."""
    figure = metric_figure([Series(reader.effective("train"), "train_loss", "train")], title="Loss",
                           sessions=reader.sessions)  # fmt: skip
    lines = [shape for shape in figure.layout.shapes if shape.type == "line"]
    assert [line.x0 for line in lines] == [60, 120]
    assert [a.text for a in figure.layout.annotations if a.hovertext] == ["S2 · resume @ 60", "S3 · resume @ 120"]
    assert [line.line.color for line in lines] == [SESSION_COLOURS[1], SESSION_COLOURS[2]]


def test_each_session_has_its_own_colour_and_data(reader: RunReader) -> None:
    """Traces are split by session, coloured per session, and hold exactly that session's rows."""
    figure = metric_figure([Series(reader.effective("train"), "train_loss", "train")], title="Loss",
                           sessions=reader.sessions)  # fmt: skip
    by_name = {trace.name: trace for trace in traces(figure, "train")}
    assert list(by_name) == ["train · S1", "train · S2", "train · S3"]
    assert [by_name[n].line.color for n in by_name] == list(SESSION_COLOURS[:3])
    assert list(by_name["train · S2"].x) == [70, 80, 90, 100, 110, 120]
    assert list(by_name["train · S2"].y) == pytest.approx([10.0 / s for s in (70, 80, 90, 100, 110, 120)])


def test_all_sessions_mode_dims_superseded_records(reader: RunReader) -> None:
    """Superseded records are drawn, dimmed, in their own traces."""
    series = Series(reader.frame("train"), "train_loss", "train", reader.superseded("train"))
    figure = metric_figure([series], title="Loss", sessions=reader.sessions)
    dimmed = {t.name: t for t in traces(figure, "train") if "superseded" in t.name}
    assert list(dimmed) == ["train · S1 (superseded)", "train · S2 (superseded)"]
    assert list(dimmed["train · S1 (superseded)"].x) == [70, 80, 90, 100]
    assert dimmed["train · S1 (superseded)"].opacity == SUPERSEDED_OPACITY


def test_smoothing_matches_the_debiased_ema_by_hand() -> None:
    """w = 0.5 on [1, 3, nan, 5]: last = 0.5, 1.75, -, 3.375; shown 0.5/0.5, 1.75/0.75, nan, 3.375/0.875."""
    smoothed = ema_smooth(np.array([1.0, 3.0, math.nan, 5.0]), 0.5)
    assert smoothed[0] == pytest.approx(1.0)
    assert smoothed[1] == pytest.approx(1.75 / 0.75)
    assert math.isnan(smoothed[2])
    assert smoothed[3] == pytest.approx(3.375 / 0.875)
    assert list(ema_smooth(np.array([1.0, 2.0]), 0.0)) == [1.0, 2.0]


@pytest.mark.parametrize("weight", [0.3, 0.6, 0.99])
def test_smoothing_a_long_series_matches_the_recurrence_point_by_point(weight: float) -> None:
    """Across many blocks and NaNs: the vectorised EMA is the per-point recurrence of its docstring."""
    rng = np.random.default_rng(7)
    values = rng.normal(size=20_000) * 10.0 ** rng.uniform(-3, 3, size=20_000)
    values[rng.random(20_000) < 0.05] = math.nan
    expected, last, n = [], 0.0, 0
    for value in values:
        if math.isnan(value):
            expected.append(math.nan)
            continue
        last, n = weight * last + (1 - weight) * value, n + 1
        expected.append(last / (1 - weight**n))
    assert np.allclose(ema_smooth(values, weight), expected, rtol=1e-9, atol=0.0, equal_nan=True)


def test_smoothed_chart_keeps_the_raw_line_faint(reader: RunReader) -> None:
    """With smoothing, each session has a faint raw trace and a solid smoothed one."""
    figure = metric_figure([Series(reader.effective("train"), "train_loss", "train")], title="Loss",
                           sessions=reader.sessions, smoothing=0.6)  # fmt: skip
    raw, smooth = traces(figure, "train · S1")
    assert smooth.name == "train · S1 (smoothed)" and smooth.legendgroup == raw.legendgroup
    assert raw.opacity < smooth.opacity == 1.0
    assert list(smooth.y) == pytest.approx(list(ema_smooth(np.array(raw.y), 0.6)))


def test_missing_values_are_gaps_with_markers(tmp_path: Path) -> None:
    """A window with no successful update is a break in the line plus a marker, never interpolated."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, grad_norm_avg=None if s == 30 else 1.0) for s in range(10, 60, 10)))
    reader = RunReader(path)
    reader.refresh()
    figure = metric_figure([Series(reader.frame("train"), "grad_norm_avg", "avg", gap_markers=True)],
                           title="g", sessions=reader.sessions)  # fmt: skip
    line = traces(figure, "avg · S1")[0]
    assert math.isnan(line.y[2]) and line.connectgaps is False
    (markers,) = traces(figure, "no successful update")
    assert list(markers.x) == [30] and markers.yaxis == "y3"


@pytest.mark.parametrize(("evaluations", "mode"), [(MARKED_POINTS, "lines+markers"), (MARKED_POINTS + 1, "lines")])
def test_a_sparse_series_keeps_its_markers_until_they_would_run_together(
    tmp_path: Path, evaluations: int, mode: str
) -> None:
    """Validation points get markers while they stay apart; a trace of more draws the line alone."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, event="validation", val_loss=1.0 / s) for s in range(1, evaluations + 1)))
    reader = RunReader(path)
    reader.refresh()
    figure = metric_figure([Series(reader.frame("validation"), "val_loss", "validation", markers=True)],
                           title="v", sessions=reader.sessions)  # fmt: skip
    (line,) = traces(figure, "validation · S1")
    assert line.mode == mode and len(line.x) == evaluations


def test_x_axis_modes(reader: RunReader) -> None:
    """Tokens, wall time and relative hours place the session boundary accordingly; a logged key as
    x (any name) titles the axis, draws no boundary it cannot place, and a row without it no point."""
    series = [Series(reader.effective("train"), "train_loss", "train")]
    tokens = metric_figure(series, title="t", sessions=reader.sessions, x="tokens_seen")
    assert tokens.layout.shapes[0].x0 == 6000
    relative = metric_figure(series, title="t", sessions=reader.sessions, x="relative")
    assert relative.layout.shapes[0].x0 == pytest.approx(60 / 3600)
    keyed = metric_figure(series, title="t", sessions=reader.sessions, x="epoch")
    assert keyed.layout.xaxis.title.text == "epoch" and not keyed.layout.shapes
    assert all(np.isnan(np.asarray(trace.x, dtype=float)).all() for trace in traces(keyed, "train ·"))


def test_downsampling_keeps_spikes_gaps_and_the_last_point() -> None:
    """1M points become <= 4000; the spike, the dip, a gap and the last point survive."""
    values = np.random.default_rng(0).normal(size=1_000_000)
    values[123_457], values[777_777], values[500_000] = 40.0, -40.0, math.nan
    keep = minmax_indices(values, 4000)
    assert len(keep) <= 4000 and np.all(np.diff(keep) > 0)
    assert {123_457, 777_777, 500_000, 999_999} <= set(keep.tolist())
    assert list(minmax_indices(np.arange(10.0), 4000)) == list(range(10))


def test_downsampling_keeps_per_bucket_its_first_row_first_min_first_max_and_first_gap() -> None:
    """The rule, against a loop over the buckets (equal-count, as ``np.linspace`` cuts them): from
    each, the first row, the first row of its smallest and of its largest finite value (its first
    row when it holds none), its first missing or infinite row, and the last row of the series;
    on series with gaps, infinities, ties and integers."""
    rng = np.random.default_rng(7)

    def expected(values: np.ndarray, max_points: int) -> list[int]:
        edges = np.linspace(0, len(values), max_points // 4 + 1).astype(np.int64)
        kept = {len(values) - 1}
        for start, stop in itertools.pairwise(edges):
            bucket = values[start:stop].astype(float)
            finite = np.isfinite(bucket)
            kept.add(int(start))
            if finite.any():
                kept |= {int(start + np.nanargmin(np.where(finite, bucket, np.nan))),
                         int(start + np.nanargmax(np.where(finite, bucket, np.nan)))}  # fmt: skip
            if not finite.all():
                kept.add(int(start + np.flatnonzero(~finite)[0]))
        return sorted(kept)

    for count in (4001, 10_007, 50_000):
        gaps = rng.normal(size=count)
        gaps[rng.random(count) < 0.05] = math.nan
        gaps[rng.random(count) < 0.01] = math.inf
        gaps[rng.random(count) < 0.01] = -math.inf
        for values in (rng.normal(size=count), gaps, np.round(rng.random(count) * 3), rng.integers(0, 4, count)):
            for max_points in (40, 400, 4000):
                assert minmax_indices(values, max_points).tolist() == expected(values, max_points)


def test_run_charts_builds_every_chart(reader: RunReader, tmp_path: Path) -> None:
    """Loss, clipped fraction, skipped updates, grad norm, LR and throughput are all there."""
    store = RunStore(reader.path.parent.parent)
    try:
        figures = run_charts(store.view("run"), ChartOptions(history="all", log_y=True))
    finally:
        store.close()
    assert list(figures) == ["loss", "clipped", "skipped", "grad_norm", "lr", "throughput"]
    assert figures["loss"].layout.yaxis.type == "log"
    assert figures["clipped"].layout.yaxis.type == "linear"
    assert any(t.name.startswith("validation") for t in figures["loss"].data)


def test_gap_markers_of_a_long_run_stay_bounded(tmp_path: Path) -> None:
    """40k windows, half with no successful update: the markers are sampled, the chart stays small."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, grad_norm_avg=None if s % 2 else 1.0) for s in range(40_000)))
    reader = RunReader(path)
    reader.refresh()
    figure = metric_figure([Series(reader.frame("train"), "grad_norm_avg", "avg", gap_markers=True)],
                           title="g", sessions=reader.sessions)  # fmt: skip
    (markers,) = traces(figure, "no successful update")
    assert 100 < len(markers.x) <= 4000 and markers.x[0] == 1 and markers.x[-1] == 39_999
    assert len(figure_json(figure)) < 200_000


# -- the straggler chart of a data-parallel run --------------------------------------------------


def test_straggler_band_spans_fastest_to_slowest_and_names_the_slowest_rank(tmp_path: Path) -> None:
    """Per session: a min line, a max line filled down to it (hover: slowest rank and ratio), the ratio on y2."""
    path = tmp_path / "r" / "metrics.jsonl"
    distributed_run(path)
    reader = RunReader(path)
    reader.refresh()
    figure = straggler_figure(reader.effective("train"), sessions=reader.sessions)
    low, high, ratio = traces(figure, "fastest rank · S2")[0], traces(figure, "rank step time")[1], None
    assert list(high.x) == list(range(70, 151, 10)) and list(low.y) == pytest.approx([0.1] * 9)
    assert high.fill == "tonexty" and list(high.y) == pytest.approx([0.1 + 0.01 * (s // 10 % 7) for s in high.x])
    assert "slowest: rank %{customdata[0]}" in high.hovertemplate
    assert {row[0] for row in high.customdata} == {"1"}
    (ratio,) = traces(figure, "slowest / fastest · S2")
    assert ratio.yaxis == "y2" and list(ratio.y) == pytest.approx([y / 0.1 for y in high.y], rel=1e-6)
    assert [s.x0 for s in figure.layout.shapes if s.type == "line"] == [60]  # the resume, as on every chart


def spread_of(tmp_path: Path, slowest: list[int], ratios: list[float]) -> str:
    """Write 4-rank train windows (fastest rank 0.375 s per step) to a run, read them back, and
    return what the straggler chart says above its plot."""
    path = tmp_path / f"r{len(list(tmp_path.iterdir()))}" / "metrics.jsonl"
    append_records(path, *(rank_window(10 * (i + 1), slowest=rank, rank_step_time_min_s=0.375,
                                       rank_step_time_max_s=0.375 * ratio)
                           for i, (rank, ratio) in enumerate(zip(slowest, ratios, strict=True))))  # fmt: skip
    reader = RunReader(path)
    reader.refresh()
    figure = straggler_figure(reader.effective("train"), sessions=reader.sessions)
    (note,) = [a for a in figure.layout.annotations if a.name == "rank spread"]
    return note.text


def test_a_rank_consistently_slowest_by_a_small_margin_is_flagged(tmp_path: Path) -> None:
    """Rank 2, 30 ms/step behind (1.08×) in 9 of the last 10 windows, is named; the ratio is always shown."""
    slowest, ratios = [0, 1, 3] + [2] * 5 + [0] + [2] * 4, [1.3, 1.4, 1.3] + [1.08] * 5 + [1.01] + [1.08] * 4
    assert spread_of(tmp_path, slowest, ratios) == (
        "slowest / fastest: 1.08× (latest window) · rank 2 consistently slowest: 9 of the last 10 windows, "
        "median 1.08×")  # fmt: skip
    assert spread_of(tmp_path, [0, 1, 2, 3] * 3, [1.08] * 12) == "slowest / fastest: 1.08× (latest window)"
    assert spread_of(tmp_path, [2] * 12, [1.02] * 12) == "slowest / fastest: 1.02× (latest window)"  # within 5%
    assert spread_of(tmp_path, [2] * 7 + [1] * 3, [1.08] * 10).endswith("(latest window)")  # 7 of 10: not yet
    assert spread_of(tmp_path, [1] * 2 + [2] * 8, [1.08] * 10).endswith("8 of the last 10 windows, median 1.08×")


def test_windows_out_of_lockstep_are_marked(tmp_path: Path) -> None:
    """ranks_in_lockstep false puts a mark on the floor at that step; true or missing does not."""
    path = tmp_path / "r" / "metrics.jsonl"
    distributed_run(path)
    append_records(path, base_record(160, session="s2", world_size=4))  # no lockstep field at all
    reader = RunReader(path)
    reader.refresh()
    train = reader.frame("train")
    assert out_of_lockstep(train).tolist() == [s == 50 for s in train["step"]]
    (marks,) = traces(straggler_figure(train, sessions=reader.sessions), "ranks out of lockstep")
    assert list(marks.x) == [50] and marks.yaxis == "y3"


def test_rank_time_ratio_is_nan_where_a_time_is_missing_or_zero() -> None:
    """max/min per window; a missing time or a zero minimum is no ratio, never inf."""
    frame = pd.DataFrame({"rank_step_time_min_s": [0.1, None, 0.0], "rank_step_time_max_s": [0.3, 0.2, 0.1]})
    ratio = rank_time_ratio(frame)
    assert ratio[0] == pytest.approx(3.0) and np.isnan(ratio[1:]).all()


def test_straggler_chart_only_for_a_multi_rank_run_and_its_csv(tmp_path: Path) -> None:
    """world_size > 1 adds the 'straggler' chart (after the others) with a CSV of what it draws; one rank adds none."""
    distributed_run(tmp_path / "dp" / "metrics.jsonl")
    append_records(tmp_path / "single" / "metrics.jsonl", *(base_record(s, train_loss=1.0, world_size=1)
                                                             for s in (10, 20)))  # fmt: skip
    store = RunStore(tmp_path)
    try:
        view = store.view("dp")
        for history in HISTORY_MODES:
            figures = run_charts(view, ChartOptions(history=history))
            assert list(figures)[-1] == "straggler" and figures["straggler"].layout.title.text == STRAGGLER_TITLE
        csv = pd.read_csv(io.StringIO("".join(chart_csv_pieces_of(view, ChartOptions(), "straggler"))))
        assert set(csv["metric"]) == {"rank_step_time_min_s", "rank_step_time_max_s", "rank_step_time_ratio",
                                      "slowest_rank", "ranks_in_lockstep"}  # fmt: skip
        assert len(csv[csv["metric"] == "slowest_rank"]) == 15  # effective history: S1 to 60, S2 from 70
        assert "straggler" not in run_charts(store.view("single"), ChartOptions())
    finally:
        store.close()


def test_a_long_runs_csv_comes_in_pieces_of_every_row_once_the_header_first(tmp_path: Path) -> None:
    """45k records: three pieces of at most ``CSV_PIECE_ROWS`` rows, the header in the first only;
    together every record's value once, in order."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0, lr=s * 1e-9) for s in range(1, 45_001)))
    store = RunStore(tmp_path)
    try:
        pieces = list(chart_csv_pieces_of(store.view("r"), ChartOptions(), "lr"))
    finally:
        store.close()
    assert len(pieces) == 3 and [piece.startswith("series,metric") for piece in pieces] == [True, False, False]
    assert [piece.count("\n") for piece in pieces] == [CSV_PIECE_ROWS + 1, CSV_PIECE_ROWS, 5_000]
    table = pd.read_csv(io.StringIO("".join(pieces)))
    assert table["step"].tolist() == list(range(1, 45_001))
    assert table["value"].to_numpy() == pytest.approx(np.arange(1, 45_001) * 1e-9, rel=1e-12)


def test_straggler_chart_of_a_long_run_stays_small(tmp_path: Path) -> None:
    """40k windows: both band edges downsampled together, spikes of either edge kept, the JSON bounded."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(rank_window(s, rank_step_time_max_s=5.0 if s == 12_345 else 0.2) for s in range(1, 40_001)))
    reader = RunReader(path)
    reader.refresh()
    figure = straggler_figure(reader.frame("train"), sessions=reader.sessions)
    (high,) = traces(figure, "rank step time")
    assert len(high.x) <= 8000 and 12_345 in list(high.x) and high.x[-1] == 40_000
    assert len(traces(figure, "fastest rank")[0].x) == len(high.x)
    assert len(figure_json(figure)) < 400_000


# -- charts a reader can trust at a glance --------------------------------------------------------


def resumed_run(path: Path, sessions: int, *, apart: int = 20, last: int = 2000) -> None:
    """``sessions`` sessions, each resuming ``apart`` steps after the previous one started."""
    for index in range(sessions):
        start = index * apart
        append_records(path, base_record(start, event="session_start", session=f"s{index}"))
        end = start + apart if index + 1 < sessions else last
        append_records(path, *(base_record(s, session=f"s{index}", train_loss=2.0) for s in range(start + 1, end + 1)))


def test_every_chart_has_titled_axes_with_units_and_deliberate_formats(reader: RunReader) -> None:
    """Loss, fraction 0–1, counts, tokens/s and LR: each y axis titled; LR in e-notation, steps in SI."""
    store = RunStore(reader.path.parent.parent)
    try:
        figures = run_charts(store.view("run"), ChartOptions())
    finally:
        store.close()
    for figure in figures.values():
        assert figure.layout.xaxis.title.text == "step" and figure.layout.xaxis.tickformat == "~s"
        assert figure.layout.yaxis.title.text
    assert figures["loss"].layout.yaxis.title.text == "loss"
    assert figures["clipped"].layout.yaxis.title.text == "fraction clipped (0–1)"
    assert list(figures["clipped"].layout.yaxis.range) == [-0.02, 1.02]
    assert "count" in figures["skipped"].layout.yaxis.title.text
    assert "cumulative" in figures["skipped"].layout.yaxis2.title.text
    # plotly.js would otherwise sync a right axis' ticks to the left grid: counts labelled 3.54896
    assert figures["skipped"].layout.yaxis2.tickmode in ("auto", "linear")
    assert figures["throughput"].layout.yaxis.title.text == "throughput (tokens/s)"
    assert figures["lr"].layout.yaxis.tickformat == ".1~e"  # 2.5e-4, never "250µ"
    assert all(figure.layout.yaxis.exponentformat == "e" for figure in figures.values())


def test_hover_names_the_full_series_its_session_and_the_step(tmp_path: Path) -> None:
    """A long run name is shortened in the legend but whole in the hover; off the step axis the step is there too."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0) for s in range(10, 60, 10)))
    reader = RunReader(path)
    reader.refresh()
    name = "group/" + "x" * 60 + "/lr3e-4"
    by_step = metric_figure([Series(reader.frame("train"), "train_loss", name)], title="Loss", sessions=reader.sessions)
    (trace,) = [t for t in by_step.data if t.x is not None and len(t.x)]
    assert trace.hovertemplate.startswith(f"{name} · S1: %{{y:")
    assert len(trace.name) < len(name) and "step" not in trace.hovertemplate  # the x axis is the step
    by_tokens = metric_figure([Series(reader.frame("train"), "train_loss", name)], title="Loss",
                              sessions=reader.sessions, x="tokens_seen")  # fmt: skip
    (trace,) = [t for t in by_tokens.data if t.x is not None and len(t.x)]
    assert "step %{customdata:,}" in trace.hovertemplate and list(trace.customdata) == [10, 20, 30, 40, 50]


@pytest.mark.parametrize("sessions", [2, 3, 8, 30])
def test_resume_labels_never_overlap(tmp_path: Path, sessions: int) -> None:
    """Sessions resumed 20 steps apart on a 2k-step run: placed labels never overlap at the narrowest width,
    and every boundary keeps its full label in a hover marker."""
    from metrics_core.dashboard.figures.layout import LABEL_CHAR_PX, MIN_PLOT_PX

    path = tmp_path / "r" / "metrics.jsonl"
    resumed_run(path, sessions)
    reader = RunReader(path)
    reader.refresh()
    figure = metric_figure([Series(reader.effective("train"), "train_loss", "train")], title="Loss",
                           sessions=reader.sessions)  # fmt: skip
    labels = [a for a in figure.layout.annotations if a.hovertext]
    scale = MIN_PLOT_PX / (2000 - 1)
    for row in (0, 16):
        boxes = sorted((a.x * scale - (len(a.text) * LABEL_CHAR_PX + 6) / 2, a.x * scale + (len(a.text) * LABEL_CHAR_PX
                        + 6) / 2) for a in labels if a.yshift == row)  # fmt: skip
        assert all(right <= next_left for (_, right), (next_left, _) in itertools.pairwise(boxes))
    (markers,) = [t for t in figure.data if t.name == "session starts"]
    assert list(markers.hovertext) == [f"S{i + 1} · resume @ {i * 20}" for i in range(1, sessions)]
    assert labels[0].text == "S2 · resume @ 20"  # the first always fits in full


def test_a_run_of_many_sessions_draws_them_as_one_trace_broken_at_each_start(tmp_path: Path) -> None:
    """Past ``SESSION_TRACES`` sessions a series is one trace (and one dimmed), broken where each
    session begins (no line joins two sessions), and the starts are hover markers, not lines and labels."""
    from metrics_core.dashboard.figures.layout import SESSION_TRACES

    path = tmp_path / "r" / "metrics.jsonl"
    count = SESSION_TRACES + 1
    resumed_run(path, count, apart=4, last=4 * count + 2)
    reader = RunReader(path)
    reader.refresh()
    figure = metric_figure([Series(reader.frame("train"), "train_loss", "train", reader.superseded("train"))],
                           title="Loss", sessions=reader.sessions)  # fmt: skip
    lines = [t for t in figure.data if t.x is not None and len(t.x) and t.name != "session starts"]
    assert [t.name for t in lines] == ["train · every session"]  # resumed where the last ended: none superseded
    (trace,) = lines
    breaks = np.flatnonzero(np.isnan(np.asarray(trace.x, dtype=np.float64)))
    assert len(breaks) == count - 1 and np.isnan(np.asarray(trace.y, dtype=np.float64)[breaks]).all()
    assert len(trace.x) == 4 * count + 2 + count - 1  # every train record (steps 1 on), and a break per resume
    (markers,) = [t for t in figure.data if t.name == "session starts"]
    assert len(markers.x) == count - 1 and not figure.layout.shapes and not figure.layout.annotations


def test_resume_label_layout_prefers_full_then_short_then_hover_only() -> None:
    """Far apart: full labels in one row; close: a second row, then "S3", then nothing (hover only)."""
    from metrics_core.dashboard.figures.layout import resume_labels

    far = resume_labels([(100, "S2 · resume @ 100", "S2"), (900, "S3 · resume @ 900", "S3")], span=1000)
    assert far == [("S2 · resume @ 100", 0), ("S3 · resume @ 900", 0)]
    close = resume_labels([(100 + i, f"S{i + 2} · resume @ {100 + i}", f"S{i + 2}") for i in range(4)], span=1000)
    assert close[:2] == [("S2 · resume @ 100", 0), ("S3 · resume @ 101", 1)] and close[2:] == [None, None]


def test_a_spike_does_not_squash_the_curve_and_autoscale_still_shows_it(tmp_path: Path) -> None:
    """One bad batch's loss of 10 over a curve living around 2: the default range hugs the curve, the
    note counts the off-scale point, a marker on the chart's top edge shows where it is (its value in
    the hover), and plotly's autoscale (autorange) is not disabled."""
    path = tmp_path / "r" / "metrics.jsonl"
    noise = np.random.default_rng(0).normal(0, 0.05, 500)
    append_records(
        path, *(base_record(s, train_loss=10.0 if s == 250 else 2.0 + float(noise[s - 1])) for s in range(1, 501))
    )
    reader = RunReader(path)
    reader.refresh()
    figure = metric_figure([Series(reader.frame("train"), "train_loss", "train")], title="Loss",
                           sessions=reader.sessions)  # fmt: skip
    low, high = figure.layout.yaxis.range
    assert 1.5 < low < 2.0 < high < 2.5
    assert any("1 point off-scale" in a.text for a in figure.layout.annotations)
    assert figure.layout.yaxis.fixedrange is not True
    (marker,) = [trace for trace in figure.data if trace.meta == "off-scale"]
    assert list(marker.x) == [250] and list(marker.y) == [1.0] and marker.yaxis == "y3"  # the top edge
    assert list(marker.customdata) == [10.0]
    assert marker.marker.symbol == "triangle-up" and marker.cliponaxis is False
    log = metric_figure([Series(reader.frame("train"), "train_loss", "train")], title="Loss", sessions=reader.sessions,
                        log_y=True)  # fmt: skip
    assert log.layout.yaxis.range[1] < math.log10(10.0)
    (marker,) = [trace for trace in log.data if trace.meta == "off-scale"]
    assert list(marker.x) == [250] and list(marker.y) == [1.0]


def test_a_loss_falling_200x_is_drawn_whole_from_its_first_point(tmp_path: Path) -> None:
    """A real decaying loss, 3.1 at step 1 down to 0.015, noisy in proportion: no point of the curve
    is off-scale on a linear or a log axis, the first value included, live or finished; a spike late
    in training is the one point left out."""
    path = tmp_path / "r" / "metrics.jsonl"
    rng = np.random.default_rng(1)
    steps = np.arange(1, 2001)
    loss = 0.015 + 3.1 * np.exp(-steps / 120) * (1 + rng.normal(0, 0.05, len(steps)))
    append_records(
        path, *(base_record(int(s), train_loss=float(v)) for s, v in zip(steps[:400], loss[:400], strict=True))
    )
    reader = RunReader(path)
    reader.refresh()
    for log_y in (False, True):
        early = metric_figure([Series(reader.frame("train"), "train_loss", "train")], title="Loss",
                              sessions=reader.sessions, log_y=log_y)  # fmt: skip
        assert not [t for t in early.data if t.meta == "off-scale"], log_y
    loss[1500] = 40.0  # one bad batch, far above even the first loss
    append_records(
        path, *(base_record(int(s), train_loss=float(v)) for s, v in zip(steps[400:], loss[400:], strict=True))
    )
    reader.refresh()
    linear = metric_figure([Series(reader.frame("train"), "train_loss", "train")], title="Loss",
                           sessions=reader.sessions)  # fmt: skip
    low, high = linear.layout.yaxis.range
    assert low <= loss.min() and loss[0] <= high < 40.0
    (marker,) = [t for t in linear.data if t.meta == "off-scale"]
    assert list(marker.x) == [1501] and list(marker.customdata) == [40.0]


def test_a_well_behaved_curve_keeps_plotly_autorange() -> None:
    """No spikes: no range is imposed (plotly's own autorange), no note; a steep start is no spike."""
    from metrics_core.dashboard.figures.metric_axes import robust_range

    assert robust_range([np.linspace(3.0, 2.0, 500)]) is None
    assert robust_range([np.r_[10.0, np.linspace(3.0, 2.0, 499)]]) is None  # the first loss is the curve's
    assert robust_range([np.array([1.0, 2.0])]) is None  # too few points to judge
    (low, high), outside = robust_range([np.r_[np.full(100, 55e3), [30e6, 40e6], np.full(100, 56e3)]])
    assert low >= 0 and high < 1e5 and outside == 2  # throughput spikes off-scale, the floor at 0


def test_skipped_updates_are_marks_where_nonzero_and_a_cumulative_step_line(tmp_path: Path) -> None:
    """5k windows: per-window skips drawn only where > 0 (markers), the cumulative count a step line on a titled y2."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, skipped_updates=s // 500, skipped_updates_in_window=int(s % 500 == 0))
                           for s in range(1, 5001)))  # fmt: skip
    reader = RunReader(path)
    reader.refresh()
    train = reader.frame("train")
    figure = metric_figure([Series(train, "skipped_updates_in_window", "per window"),
                            Series(train, "skipped_updates", "cumulative", secondary_y=True)],
                           title="Skipped updates", sessions=reader.sessions)  # fmt: skip
    (marks,) = [t for t in figure.data if t.name == "per window · S1"]
    assert marks.mode == "markers" and list(marks.x[np.isfinite(np.asarray(marks.y, dtype=float))]) == list(
        range(500, 5001, 500)
    )
    (line,) = [t for t in figure.data if t.name == "cumulative · S1"]
    assert line.line.shape == "hv" and line.yaxis == "y2"
    assert figure.layout.yaxis2.title.text == "skipped, cumulative (count)"


def test_sparse_series_are_drawn_raw_with_markers_beside_smoothed_dense_ones(reader: RunReader) -> None:
    """Validation every N steps is not EMA-smoothed; train loss is (with its faint raw line)."""
    figure = metric_figure([Series(reader.effective("train"), "train_loss", "train"),
                            Series(reader.effective("validation"), "val_loss", "validation", markers=True)],
                           title="Loss", sessions=reader.sessions, smoothing=0.9)  # fmt: skip
    names = [t.name for t in figure.data if t.name]
    assert any(n.startswith("train") and n.endswith("(smoothed)") for n in names)
    assert not any(n.startswith("validation") and "smoothed" in n for n in names)


def test_one_legend_entry_per_series_and_per_session(reader: RunReader) -> None:
    """Three sessions, two series: the legend lists "train" and "validation" once each, then each
    session in its colour with what it did (the same key the page shows above the charts)."""
    from metrics_core.dashboard.figures.layout import session_key

    figure = metric_figure([Series(reader.effective("train"), "train_loss", "train"),
                            Series(reader.effective("validation"), "val_loss", "validation", markers=True)],
                           title="Loss", sessions=reader.sessions)  # fmt: skip
    assert [t.name for t in figure.data if t.showlegend is not False and t.name] == [
        "train",
        "validation",
        "S1 · start",
        "S2 · resume @ 60",
        "S3 · resume @ 120",
    ]
    assert [t.line.color for t in figure.data if t.legendgroup == "sessions"] == list(SESSION_COLOURS[:3])
    assert session_key(reader.sessions) == [("S1", SESSION_COLOURS[0], "start"),
                                            ("S2", SESSION_COLOURS[1], "resume @ 60"),
                                            ("S3", SESSION_COLOURS[2], "resume @ 120")]  # fmt: skip
    single = metric_figure([Series(reader.effective("train"), "train_loss", "train")], title="Loss",
                           sessions=reader.sessions[:1])  # fmt: skip
    assert not [trace for trace in single.data if trace.legendgroup == "sessions"]
    assert not [trace for trace in single.data if trace.showlegend]  # one line: nothing to tell apart
    smoothed = metric_figure([Series(reader.effective("train"), "train_loss", "train")], title="Loss",
                             sessions=reader.sessions[:1], smoothing=0.6)  # fmt: skip
    assert [t.name for t in smoothed.data if t.showlegend] == ["train", "raw (unsmoothed)"]
    # plotly.js leaves a trace of no points out of the legend: every entry holds one (null) point
    assert all(len(t.x) == 1 for t in [*figure.data, *smoothed.data] if t.hoverinfo == "skip" and t.showlegend)


def test_every_chart_builder_draws_the_theme_it_is_given(tmp_path: Path) -> None:
    """Run page, zoom, sessions overlay and compare charts come out dark when asked, with no
    recolouring by the page; the light and dark run charts are separate memo entries."""
    from metrics_core.dashboard.figures.chart_memo import view_charts, zoom_chart
    from metrics_core.dashboard.figures.layout import THEMES
    from metrics_core.dashboard.figures.run_charts import session_overlay

    three_session_run(tmp_path / "r" / "metrics.jsonl")
    store = RunStore(tmp_path)
    try:
        view = store.view("r")
        dark, light = ChartOptions(theme="dark"), ChartOptions()
        figures = [*view_charts(view, dark).values(), zoom_chart(view, dark, "loss", (0.0, 100.0)),
                   session_overlay(view, x="step", smoothing=0.0, theme="dark"),
                   compare_chart({"r": view}, "val_loss", x="step", smoothing=0.0, log_y=False, theme="dark"),
                   ]  # fmt: skip
        for figure in figures:
            assert figure.layout.plot_bgcolor == THEMES["dark"]["plot"]
            assert figure.layout.font.color == THEMES["dark"]["font"]
        assert view_charts(view, dark) is view_charts(view, dark)
        assert view_charts(view, light)["loss"].layout.plot_bgcolor == THEMES["light"]["plot"]
    finally:
        store.close()


def test_compare_draws_validation_loss_raw_with_markers(tmp_path: Path) -> None:
    """val_loss on the compare page is a sparse series: markers, no smoothed trace, like the run page."""
    three_session_run(tmp_path / "r" / "metrics.jsonl")
    store = RunStore(tmp_path)
    try:
        figure = compare_chart({"r": store.view("r")}, "val_loss", x="step", smoothing=0.6, log_y=False)
        drawn = [trace for trace in figure.data if trace.x is not None and len(trace.x)]
        assert drawn and all("markers" in trace.mode for trace in drawn)
        assert not any("smoothed" in (trace.name or "") for trace in figure.data)
    finally:
        store.close()


@pytest.mark.parametrize("options", [ChartOptions(), ChartOptions(x="time", smoothing=0.6, log_y=True, history="all"),
                                     ChartOptions(x="tokens_seen", history="sessions", theme="dark")])  # fmt: skip
def test_figures_built_without_validation_are_what_plotly_validates(reader: RunReader, tmp_path: Path,
                                                                    options: ChartOptions) -> None:  # fmt: skip
    """Every chart (a three-session run, a data-parallel run) passes plotly's validation unchanged."""
    distributed_run(tmp_path / "dist" / "metrics.jsonl")
    store = RunStore(tmp_path)
    try:
        figures = [*run_charts(store.view("run"), options).values(), *run_charts(store.view("dist"), options).values()]
    finally:
        store.close()
    assert STRAGGLER_TITLE in {figure.layout.title.text for figure in figures}
    for figure in figures:
        validated = go.Figure(figure)  # raises on a misspelt property or a bad value
        assert json.loads(validated.to_json()) == json.loads(figure_json(figure))


def test_no_template_is_what_plotly_makes_of_template_none() -> None:
    """Every figure's template is plotly's "none" template, as plotly itself spells it out."""
    import plotly.io as pio

    assert pio.templates["none"].to_plotly_json() == NO_TEMPLATE


def logged_run(path: Path) -> None:
    """Train records with the writer's fields and three keys of the user's, a validation key, a
    constant LR and no skipped update; one validation record."""
    append_records(path, *(base_record(s, train_loss=4.0 / s, lr=3e-4, skipped_updates_in_window=0, mfu=0.3 + s / 1e3,
                                       epoch=s // 30, **{"sys/gpu_mem_gb": 40.0 + s / 100})
                           for s in range(10, 101, 10)),
                   base_record(100, event="validation", val_loss=2.0, **{"val/accuracy": 0.75}))  # fmt: skip


def test_every_logged_number_gets_a_chart_under_its_prefix(tmp_path: Path) -> None:
    """The six defaults first, then a chart per key the user logged, grouped by the part before "/"
    (else by the event that logs it), each drawing exactly that key's values; the writer's own
    fields get no chart of their own."""
    logged_run(tmp_path / "run" / "metrics.jsonl")
    store = RunStore(tmp_path)
    try:
        view = store.view("run")
        options = ChartOptions()
        figures = run_charts(view, options)
        groups, matched = grouped_figures(view, options, figures)
    finally:
        store.close()
    assert list(figures)[:6] == ["loss", "clipped", "skipped", "grad_norm", "lr", "throughput"]
    assert {group: list(charts) for group, charts in groups.items() if group} == {
        "sys": ["key:sys/gpu_mem_gb"],
        "train": ["key:epoch", "key:mfu"],
        "val": ["key:val/accuracy"],
    }
    assert matched == 4
    mfu = [trace for trace in figures["key:mfu"]["data"] if trace.get("name") == "train · S1"]
    assert list(mfu[0]["x"]) == list(range(10, 101, 10))
    assert list(mfu[0]["y"]) == pytest.approx([0.3 + s / 1e3 for s in range(10, 101, 10)], rel=1e-6)
    assert figures["key:mfu"]["layout"]["title"]["text"] == "mfu"
    assert figures["key:val/accuracy"]["layout"]["yaxis"]["title"]["text"] == "val/accuracy"
    assert figures["key:epoch"]["layout"]["yaxis"]["dtick"] == 1  # an integer key counts


def test_the_chart_filter_builds_only_what_it_keeps_and_caps_the_logged_charts(tmp_path: Path) -> None:
    """A filter keeps the charts whose title or key matches (the others are not built); with no
    filter, 200 logged keys give the defaults and ``MAX_LOGGED_CHARTS`` of them, and the count of
    all that matched; a refused filter (too long) keeps all, and the page says why."""
    path = tmp_path / "run" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0, **{f"k/{n:03}": float(n + s) for n in range(200)})
                           for s in (1, 2, 3)))  # fmt: skip
    store = RunStore(tmp_path)
    try:
        view = store.view("run")
        every = run_charts(view, ChartOptions())
        some = run_charts(view, ChartOptions(only="^loss$ | k/010|k/011$|K/012"))
        _, matched = grouped_figures(view, ChartOptions(), every)
        picked, _ = pick_charts(charts_of(view), "k/010|" * FILTER_MAX_CHARS)
    finally:
        store.close()
    assert len(every) == 6 + MAX_LOGGED_CHARTS and matched == 200
    assert list(some) == ["loss", "key:k/010", "key:k/011", "key:k/012"]
    assert len(picked) == 6 + MAX_LOGGED_CHARTS


def test_axes_say_what_the_data_is(tmp_path: Path) -> None:
    """A constant LR is drawn on a band around 3e-4 that leaves out 0; a count with nothing counted
    starts at 0 with whole ticks; a chart of a key never logged says so."""
    logged_run(tmp_path / "run" / "metrics.jsonl")
    store = RunStore(tmp_path)
    try:
        view = store.view("run")
        figures = run_charts(view, ChartOptions())
        logged_everywhere = compare_chart({"run": view}, "nothing_logged", x="step", smoothing=0.0, log_y=False)
    finally:
        store.close()
    low, high = figures["lr"]["layout"]["yaxis"]["range"]
    assert 0 < low < 3e-4 < high
    for axis in ("yaxis", "yaxis2"):
        skipped = figures["skipped"]["layout"][axis]
        assert skipped["range"][0] == 0 and skipped["rangemode"] == "tozero"
        assert skipped["tickmode"] == "linear" and skipped["dtick"] == 1
    notes = [note["text"] for note in logged_everywhere["layout"].get("annotations", [])]
    assert notes == ["none logged"]
    assert "none logged" not in str(figures["loss"]["layout"].get("annotations"))


def test_compare_offers_every_key_the_runs_logged(tmp_path: Path) -> None:
    """The compare page's metrics: the mission's, then each key any compared run logged, charted
    from the event that logs it (validation keys raw, with markers)."""
    logged_run(tmp_path / "a" / "metrics.jsonl")
    small_run(tmp_path / "b" / "metrics.jsonl")
    store = RunStore(tmp_path)
    try:
        views = {"a": store.view("a"), "b": store.view("b")}
        choices = compare_metrics(views)
        accuracy = compare_chart(views, "val/accuracy", x="step", smoothing=0.6, log_y=False)
    finally:
        store.close()
    assert list(choices)[:7] == ["train_loss", "val_loss", "grad_norm_avg", "clipped_fraction", "skipped_updates",
                                 "lr", "tokens_per_s"]  # fmt: skip
    assert list(choices)[7:] == ["epoch", "mfu", "sys/gpu_mem_gb", "val/accuracy"]
    assert choices["val/accuracy"] == ("validation", "val/accuracy")
    (trace,) = [trace for trace in accuracy["data"] if trace.get("name") == "a"]
    assert list(trace["x"]) == [100] and list(trace["y"]) == [0.75] and trace["mode"] == "lines+markers"
