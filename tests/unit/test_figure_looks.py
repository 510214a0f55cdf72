"""What a chart's layout leaves readable: the off-scale note off a converged curve's end, log ticks
that are not crammed, and a wall-time axis whose title stays clear of the legend."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from metrics_core.dashboard.figures.layout import LABEL_ROW_PX, Highlight
from metrics_core.dashboard.figures.metric_figures import metric_figure
from metrics_core.dashboard.views.chart_specs import Series
from metrics_core.read.run_reader import RunReader
from tests.support import append_records, base_record


def figure_of(tmp_path: Path, values: list[float], *, log_y: bool = False, x: str = "step") -> object:
    """The train_loss chart of a run that logged ``values``, one a step."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(step, train_loss=value) for step, value in enumerate(values, 1)))
    reader = RunReader(path)
    reader.refresh()
    return metric_figure([Series(reader.frame("train"), "train_loss", "train")], title="Loss",
                         sessions=reader.sessions, log_y=log_y, x=x)  # fmt: skip


def off_scale_note(figure: object) -> object:
    (note,) = [a for a in figure.layout.annotations if "off-scale" in (a.text or "")]
    return note


def test_the_off_scale_note_sits_away_from_where_the_curves_end(tmp_path: Path) -> None:
    """A loss converging at the bottom of its range with one spike: the note is in the top corner,
    not over the converged tail; an accuracy rising to the top with one dip: the bottom corner."""
    noise = np.random.default_rng(0).normal(0, 0.01, 400)
    loss = [2.0 / (1 + step / 20) + 0.3 + float(noise[step]) for step in range(400)]
    loss[200] = 40.0
    note = off_scale_note(figure_of(tmp_path / "loss", loss))
    assert (note.y, note.yanchor) == (1, "top")
    accuracy = [0.9 - 0.5 / (1 + step / 20) + float(noise[step]) for step in range(400)]
    accuracy[200] = -30.0
    note = off_scale_note(figure_of(tmp_path / "accuracy", accuracy))
    assert (note.y, note.yanchor) == (0, "bottom")


def test_log_ticks_within_a_decade_or_three_are_1_2_5(tmp_path: Path) -> None:
    """A loss from 1.5 to 0.05 on a log axis: ticks at 1, 2 and 5 of each decade, not at every digit;
    the same chart on a linear axis keeps plotly's ticks."""
    loss = [1.5 * (0.05 / 1.5) ** (step / 299) for step in range(300)]
    assert figure_of(tmp_path / "log", loss, log_y=True).layout.yaxis.dtick == "D2"
    assert figure_of(tmp_path / "linear", loss).layout.yaxis.dtick is None


def test_wall_time_ticks_are_one_line_so_the_axis_title_stays_above_the_legend(tmp_path: Path) -> None:
    """plotly's default date ticks take two lines and pushed "wall time (UTC)" into the legend: the
    time axis names its one-line format, and its hover the second."""
    axis = figure_of(tmp_path, [1.0, 0.5, 0.25], x="time").layout.xaxis
    assert axis.title.text == "wall time (UTC)" and axis.tickformat and "\n" not in axis.tickformat
    assert "<br>" not in axis.tickformat and axis.hoverformat.endswith("%S")


def test_two_replays_labels_sit_on_two_rows_so_a_narrow_chart_does_not_overlap_them(tmp_path: Path) -> None:
    """Two replays a few hundred steps apart (the demo's run on a phone): their labels are on two
    rows, the second a label's height lower, not one over the other."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(step, train_loss=1.0 / step) for step in range(1, 1000)))
    reader = RunReader(path)
    reader.refresh()
    replays = [Highlight(206.0, 600.0, "replay S1→S2 · Δloss +0.00332", "#ff7f0e"),
               Highlight(803.0, 1200.0, "replay S2→S3 · Δloss +0.00573", "#2ca02c")]  # fmt: skip
    figure = metric_figure([Series(reader.frame("train"), "train_loss", "train")], title="Loss",
                           sessions=reader.sessions, highlights=replays)  # fmt: skip
    labels = [a for a in figure.layout.annotations if (a.text or "").startswith("replay")]
    assert [(a.x, a.yshift or 0) for a in labels] == [(206.0, 0), (803.0, -LABEL_ROW_PX)]


def test_resume_labels_of_a_chart_with_a_right_axis_fit_its_narrower_plot(tmp_path: Path) -> None:
    """The demo's run (resumes at 206 and 803 over 1,500 steps): on the loss chart both labels fit
    one row at a phone's width; the skipped-updates chart's right axis narrows its plot, so its two
    labels no longer fit one row (they overlapped there on a phone): the second goes a row up."""
    path = tmp_path / "r" / "metrics.jsonl"
    for session, (first, last) in (("s1", (1, 593)), ("s2", (206, 1199)), ("s3", (803, 1500))):
        steps = range(first, last + 1, 3)
        append_records(path, *(base_record(step, session=session, train_loss=1.0 / step, skipped_updates_in_window=0,
                                           skipped_updates=step // 50) for step in steps))  # fmt: skip
    reader = RunReader(path)
    reader.refresh()
    frame = reader.frame("train")

    def labels(*series: Series) -> list[tuple[str, int]]:
        figure = metric_figure(list(series), title="t", sessions=reader.sessions)
        return [(a.text, a.yshift or 0) for a in figure.layout.annotations if (a.text or "").startswith("S")]

    assert labels(Series(frame, "train_loss", "train")) == [("S2 · resume @ 206", 0), ("S3 · resume @ 803", 0)]
    skipped = labels(Series(frame, "skipped_updates_in_window", "per window"),
                     Series(frame, "skipped_updates", "cumulative", secondary_y=True))  # fmt: skip
    assert skipped == [("S2 · resume @ 206", 0), ("S3 · resume @ 803", LABEL_ROW_PX)]
