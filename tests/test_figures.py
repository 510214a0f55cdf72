"""Figure functions and downsampling, tested without a server: data in, plotly figure out."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from metrics_core.dashboard.charts import HISTORY_MODES, ChartOptions, chart_csv, chart_specs, run_charts
from metrics_core.dashboard.figures import (
    SESSION_COLOURS,
    STRAGGLER_TITLE,
    SUPERSEDED_OPACITY,
    Series,
    ema_smooth,
    metric_figure,
    out_of_lockstep,
    rank_time_ratio,
    straggler_figure,
)
from metrics_core.dashboard.store import RunStore
from metrics_core.downsample import minmax_indices
from metrics_core.reader import RunReader
from tests.conftest import append_records, base_record
from tests.test_reader import three_session_run


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
    assert [a.text for a in figure.layout.annotations] == ["S2 · resume @ 60", "S3 · resume @ 120"]
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


def test_x_axis_modes(reader: RunReader) -> None:
    """Tokens, wall time and relative hours place the session boundary accordingly."""
    series = [Series(reader.effective("train"), "train_loss", "train")]
    tokens = metric_figure(series, title="t", sessions=reader.sessions, x="tokens_seen")
    assert tokens.layout.shapes[0].x0 == 6000
    relative = metric_figure(series, title="t", sessions=reader.sessions, x="relative")
    assert relative.layout.shapes[0].x0 == pytest.approx(60 / 3600)
    with pytest.raises(ValueError, match="x must be one of"):
        metric_figure(series, title="t", sessions=reader.sessions, x="epoch")


def test_downsampling_keeps_spikes_gaps_and_the_last_point() -> None:
    """1M points become <= 4000; the spike, the dip, a gap and the last point survive."""
    values = np.random.default_rng(0).normal(size=1_000_000)
    values[123_457], values[777_777], values[500_000] = 40.0, -40.0, math.nan
    keep = minmax_indices(values, 4000)
    assert len(keep) <= 4000 and np.all(np.diff(keep) > 0)
    assert {123_457, 777_777, 500_000, 999_999} <= set(keep.tolist())
    assert list(minmax_indices(np.arange(10.0), 4000)) == list(range(10))


def test_downsampled_chart_json_stays_small(tmp_path: Path) -> None:
    """A 200k-window run's loss chart is well under the 200 KB budget and still has its last point."""
    from benchmarks.generate import write_run

    write_run(tmp_path / "big" / "metrics.jsonl", 200_000)
    store = RunStore(tmp_path)
    try:
        view = store.view("big")
        figures = run_charts(view, ChartOptions(smoothing=0.6))
        for figure in figures.values():
            assert len(figure.to_json()) < 200_000
        last_step = int(view.effective("train")["step"].iloc[-1])
        assert max(max(t.x, default=0) for t in figures["loss"].data if t.name.startswith("train")) == last_step
    finally:
        store.close()


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
    assert len(figure.to_json()) < 200_000


# -- the straggler chart of a data-parallel run --------------------------------------------------


def rank_window(step: int, *, session: str = "s1", slowest: int = 3, lockstep: bool = True, **values: object) -> dict:
    """A train record as DistributedWindow writes it on a 4-rank job: rank 0.10 s, the slowest 0.10–0.16 s."""
    fields = {"train_loss": 1.0 / step, "world_size": 4, "slowest_rank": slowest, "rank_step_time_min_s": 0.1,
              "rank_step_time_max_s": 0.1 + 0.01 * (step // 10 % 7), "rank_tokens_per_s_min": 900.0,
              "rank_tokens_per_s_max": 1000.0, "ranks_in_lockstep": lockstep}  # fmt: skip
    return base_record(step, session=session, **{**fields, **values})


def distributed_run(path: Path) -> None:
    """Two sessions of a 4-rank job (S2 resumes at 60); the window at step 50 had ranks out of lockstep."""
    append_records(path, *(rank_window(s, lockstep=s != 50) for s in range(10, 101, 10)))
    append_records(path, base_record(60, event="session_start", session="s2"))
    append_records(path, *(rank_window(s, session="s2", slowest=1) for s in range(70, 151, 10)))


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
        csv = pd.read_csv(io.StringIO(chart_csv(chart_specs(view, "effective")["straggler"])))
        assert set(csv["metric"]) == {"rank_step_time_min_s", "rank_step_time_max_s", "rank_step_time_ratio",
                                      "slowest_rank", "ranks_in_lockstep"}  # fmt: skip
        assert len(csv[csv["metric"] == "slowest_rank"]) == 15  # effective history: S1 to 60, S2 from 70
        assert "straggler" not in run_charts(store.view("single"), ChartOptions())
    finally:
        store.close()


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
    assert len(figure.to_json()) < 400_000
