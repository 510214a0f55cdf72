"""The pages' charts and tables, as pure functions of ``RunView`` snapshots and page options."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from metrics_core.analysis import ReplayWindow, replay_windows, tokens_per_second
from metrics_core.dashboard.figures import CHART_POINTS, Figure, Highlight, session_colour, x_values
from metrics_core.dashboard.metric_figures import Series, metric_figure
from metrics_core.dashboard.rank_figures import STRAGGLER_TITLE, is_distributed, rank_time_ratio, straggler_figure
from metrics_core.dashboard.store import RunView
from metrics_core.diagnostics import Finding, diagnose

HISTORY_MODES = {
    "effective": "effective history",
    "all": "all sessions (superseded dimmed)",
    "sessions": "sessions overlaid, replays shaded",
}
# metric -> (event, label) for the compare page
COMPARE_METRICS = {
    "train_loss": ("train", "train loss"),
    "val_loss": ("validation", "validation loss"),
    "grad_norm_avg": ("train", "grad norm avg"),
    "clipped_fraction": ("train", "clipped fraction"),
    "skipped_updates": ("train", "skipped updates (cumulative)"),
    "lr": ("train", "learning rate"),
    "tokens_per_s": ("train", "tokens/s"),
}
_log = logging.getLogger(__name__)
RUN_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


@dataclass(frozen=True)
class ChartOptions:
    """What the run page's controls choose, and the browser's theme ("light"/"dark", ``THEMES``).

    The theme is part of every memo and lineage key the options are, so a dark tab and a light
    tab each get their own figures, built coloured (no recoloured copy per snapshot).
    """

    x: str = "step"
    smoothing: float = 0.0
    log_y: bool = False
    history: str = "effective"
    theme: str = "light"


@dataclass(frozen=True)
class ChartSpec:
    """One chart: its series, and whether smoothing and a log scale apply to it.

    ``kind`` "lines" is drawn by ``metric_figure``; "straggler" by ``straggler_figure`` from the
    first series' frame (the other series are what its CSV holds).
    """

    title: str
    series: list[Series]
    smoothed: bool
    loggable: bool
    kind: str = "lines"


def _with_throughput(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(tokens_per_s=tokens_per_second(frame)) if len(frame) else frame


def _rows(view: RunView, event: str, history: str) -> tuple[pd.DataFrame, np.ndarray | None]:
    """The rows a history mode draws, and which of them to dim."""
    if history == "effective":
        return view.effective(event), None
    return view.frames[event], view.superseded[event] if history == "all" else None


def chart_specs(view: RunView, history: str) -> dict[str, ChartSpec]:
    """Loss, clipped fraction, skipped updates, grad norm, LR and throughput, keyed by chart id;
    and for a data-parallel run (``world_size`` > 1), the ranks' step-time spread."""
    train, dim = _rows(view, "train", history)
    validation, validation_dim = _rows(view, "validation", history)
    specs = {
        "loss": ChartSpec("Loss", [Series(train, "train_loss", "train", dim),
                                   Series(validation, "val_loss", "validation", validation_dim, markers=True)],
                          True, True),
        "clipped": ChartSpec("Clipped fraction", [
            Series(train, "clipped_fraction", "clipped", dim, gap_markers=True)], False, False),
        "skipped": ChartSpec("Skipped updates", [
            Series(train, "skipped_updates_in_window", "per window", dim),
            Series(train, "skipped_updates", "cumulative", dim, secondary_y=True)], False, False),
        "grad_norm": ChartSpec("Gradient norm (pre-clip)", [
            Series(train, "grad_norm_avg", "avg", dim, gap_markers=True),
            Series(train, "grad_norm_max", "max", dim)], True, True),
        "lr": ChartSpec("Learning rate", [Series(train, "lr", "lr", dim)], False, True),
        "throughput": ChartSpec("Throughput (tokens/s)", [
            Series(_with_throughput(train), "tokens_per_s", "tokens/s", dim)], True, False),
    }  # fmt: skip
    if is_distributed(view.frames["train"]):
        ranks = train.assign(rank_step_time_ratio=rank_time_ratio(train))
        specs["straggler"] = ChartSpec(STRAGGLER_TITLE, [
            Series(ranks, "rank_step_time_min_s", "fastest rank's time", dim),
            Series(ranks, "rank_step_time_max_s", "slowest rank's time", dim),
            Series(ranks, "rank_step_time_ratio", "slowest / fastest", dim),
            Series(ranks, "slowest_rank", "slowest rank", dim),
            Series(ranks, "ranks_in_lockstep", "ranks in lockstep", dim)], False, False, kind="straggler")  # fmt: skip
    return specs


def replays(view: RunView) -> list[ReplayWindow]:
    return replay_windows(view.frames["train"], view.sessions, view.replaced)


def replay_highlights(view: RunView, x: str) -> list[Highlight]:
    """Shaded x-ranges of each replay window: the superseded tail and its redo, with the loss change."""
    train = view.frames["train"]
    origin = pd.Timestamp(view.sessions[0].start_time) if view.sessions else None
    result = []
    for window in replays(view):
        session = view.sessions[window.session]
        rows = view.replaced[window.session] | (
            (train["session_id"] == session.session_id)
            & (train["step"] >= window.first_step) & (train["step"] <= window.last_step)
        ).to_numpy()  # fmt: skip
        if x in ("step", "tokens_seen"):
            xs = x_values(train[rows], x, origin)
            x0 = session.first_step if x == "step" else session.first_tokens_seen
            delta = "" if window.loss_delta is None else f" · Δloss {window.loss_delta:+.3g}"
            label = f"replay S{window.session}→S{window.session + 1}{delta}"
            result.append(Highlight(float(x0), float(np.max(xs)), label, session_colour(window.session)))
    return result


def run_charts(view: RunView, options: ChartOptions, *, max_points: int = CHART_POINTS) -> dict[str, Figure]:
    """Every chart of the run page as a figure (each with a budget of ``max_points`` drawn points)."""
    highlights = replay_highlights(view, options.x) if options.history == "sessions" else []
    specs = chart_specs(view, options.history)
    figures = {
        key: metric_figure(
            spec.series,
            title=spec.title,
            sessions=view.sessions,
            x=options.x,
            smoothing=options.smoothing if spec.smoothed else 0.0,
            log_y=options.log_y and spec.loggable,
            revision=f"{view.name}:{key}:{options.x}:{options.log_y and spec.loggable}:{options.history}",
            highlights=highlights,
            max_points=max_points,
            theme=options.theme,
        )
        for key, spec in specs.items()
        if spec.kind == "lines"
    }
    if "straggler" in specs:
        first = specs["straggler"].series[0]
        figures["straggler"] = straggler_figure(
            first.frame, sessions=view.sessions, superseded=first.superseded, x=options.x, highlights=highlights,
            revision=f"{view.name}:straggler:{options.x}:{options.history}", max_points=max_points,
            theme=options.theme,
        )  # fmt: skip
    return figures


def chart_key(key: str) -> str:
    """The Streamlit key of the run page's live chart ``key`` (its element carries the class
    ``st-key-<that>``)."""
    return f"chart_{key}"


def view_charts(view: RunView, options: ChartOptions) -> dict[str, Figure]:
    """The run page's charts, once per snapshot and options, shared by every tab.

    On a long live run they are extended, not rebuilt (``_extend_charts``): cost O(appended
    records + smoothing warm-up), where ``run_charts`` costs O(records) (~0.5 s per 1M).
    """
    return view.memo(("charts", options), lambda: _carried_charts(view, options))


# Incremental charts.  A full build min/max-downsamples the whole run; a live update then draws
# its records raw on top of that base, computed from a tail of the run just long enough for the
# smoothing to forget where it started (so every new point and its smoothed value are exact to
# ~1e-7), until the raw tail is long or old enough to fold into a new full build.
INCREMENTAL_FROM_ROWS = 20_000  # below this a full build costs < ~50 ms: always exact
TAIL_REBUILD_ROWS = 2_000  # appended rows drawn raw before the next full build
TAIL_REBUILD_S = 120.0
# Full builds of a live run's charts, and diagnostics from scratch, take at most this share of a
# core each (the rate is cost / share; a live tab's goal is 10 % of a core in all, issue 10).  A
# live run's diagnostics are extended per snapshot instead (O(appended rows)): always current.
REBUILD_CPU_SHARE = 0.02
EMA_FORGET = 1e-7  # the smoothing's warm-up: rows until the start's weight falls below this
TAIL_EVENTS = ("train", "validation")


@dataclass(frozen=True, eq=False)
class _Charts:
    """The charts of ``view``, and the full build they extend (``base``), with its clock and cost."""

    view: RunView
    figures: dict[str, Figure]
    base: RunView
    built_at: float
    cost_s: float


def _carried_charts(view: RunView, options: ChartOptions) -> dict[str, Figure]:
    stale: list[bool] = []

    def update(previous: _Charts | None) -> _Charts | None:
        if previous is not None and view.records < previous.view.records:
            stale.append(True)  # a tab still holding an older snapshot: leave the lineage alone
            return previous
        if previous is not None and previous.view is view:
            return previous
        extended = _extend_charts(previous, view, options) if previous is not None else None
        return extended or _full_charts(view, options)

    carried = view.lineage.carry(("charts", options), update)
    return run_charts(view, options) if stale else carried.figures


def _full_charts(view: RunView, options: ChartOptions) -> _Charts:
    start = time.perf_counter()
    figures = run_charts(view, options)
    return _Charts(view, figures, view, time.monotonic(), time.perf_counter() - start)


def _warmup_rows(options: ChartOptions) -> int:
    """Rows before the first new one that a tail needs: the smoothing's memory, and one row for
    the throughput's difference."""
    if options.smoothing <= 0:
        return 2
    return int(np.ceil(np.log(EMA_FORGET) / np.log(options.smoothing))) + 2


def _extend_charts(previous: _Charts, view: RunView, options: ChartOptions) -> _Charts | None:
    """``previous`` plus ``view``'s appended records, or None when only a full build will do."""
    base = previous.base
    rows = {event: len(base.frames[event]) for event in TAIL_EVENTS}
    if (
        options.history == "sessions"  # replay shading follows the data
        or max(rows.values()) < INCREMENTAL_FROM_ROWS
        or len(view.sessions) != len(base.sessions)
        or view.ingest.resets != base.ingest.resets
        or any(len(view.frames[event]) < rows[event] for event in TAIL_EVENTS)
    ):
        return None
    appended = sum(len(view.frames[event]) - rows[event] for event in TAIL_EVENTS)
    age = time.monotonic() - previous.built_at
    if appended > TAIL_REBUILD_ROWS or age > max(TAIL_REBUILD_S, previous.cost_s / REBUILD_CPU_SHARE):
        return None
    for event in TAIL_EVENTS:  # an old record newly superseded changes old points: O(rows), ~1 ms per 1M
        if not np.array_equal(view.superseded[event][: rows[event]], base.superseded[event]):
            return None
    warmup = _warmup_rows(options)
    # From the previous snapshot on, not the base: each update pays for its own records only.
    starts = {event: max(0, min(len(previous.view.frames[event]), len(view.frames[event])) - warmup)
              for event in TAIL_EVENTS}  # fmt: skip
    tail = _tail_view(view, starts)
    tail_figures = run_charts(tail, options, max_points=10 * (warmup + TAIL_REBUILD_ROWS))
    figures = {}
    for key, figure in previous.figures.items():
        grown = _append_points(figure, tail_figures.get(key))
        if grown is None:
            return None
        figures[key] = grown
    return _Charts(view, figures, base, previous.built_at, previous.cost_s)


def _tail_view(view: RunView, starts: Mapping[str, int]) -> RunView:
    """``view`` with only the rows of ``starts``' events from those positions on (the others whole)."""
    frames, superseded = dict(view.frames), dict(view.superseded)
    for event, start in starts.items():
        frames[event] = view.frames[event].iloc[start:].reset_index(drop=True)
        superseded[event] = view.superseded[event][start:]
    start = starts["train"]
    replaced = {index: rows[start:] for index, rows in view.replaced.items()}
    return replace(view, frames=frames, superseded=superseded, replaced=replaced, lineage=view.lineage)


def _append_points(figure: Figure, tail: Figure | None) -> Figure | None:
    """``figure`` with each trace extended by the points of ``tail``'s trace of the same name and
    axis that lie beyond its last x; None when a tail trace with new points has no counterpart."""
    if tail is None:
        return None
    traces = {(trace.get("name"), trace.get("yaxis")): number for number, trace in enumerate(figure["data"])}
    grown: dict[int, dict[str, np.ndarray]] = {}
    for trace in tail["data"]:
        xs = np.asarray(trace["x"]) if trace.get("x") is not None else np.zeros(0)
        number = traces.get((trace.get("name"), trace.get("yaxis")))
        old = figure["data"][number] if number is not None else {}
        last = old["x"][-1] if old.get("x") is not None and len(old["x"]) else None
        new = np.ones(len(xs), dtype=bool) if last is None else xs > last
        if not new.any():
            continue
        if number is None:
            return None  # a trace the base does not have (a first gap marker): rebuild
        names = [name for name in ("x", "y", "customdata") if old.get(name) is not None and trace.get(name) is not None]
        grown[number] = {name: np.concatenate([np.asarray(old[name]), np.asarray(trace[name])[new]]) for name in names}
    if not grown:
        return figure  # the same object: every tab's transport says "same"
    # A new figure (figures are shared by every tab: never changed in place) sharing the layout
    # and every unchanged trace.
    data = [{**trace, **grown[number]} if number in grown else trace for number, trace in enumerate(figure["data"])]
    return Figure(data=data, layout=figure["layout"])


def zoom_chart(view: RunView, options: ChartOptions, key: str, xrange: tuple[float, float]) -> Figure:
    """Chart ``key`` drawn from only the records whose x lies in ``xrange`` (plus the smoothing's
    warm-up before it), so a zoom into 1,000 records of a 5M-record run shows every one of them
    raw; downsampled only beyond the chart's point budget.  Once per snapshot, options and range.
    Cost: one O(rows) mask per event (~10 ms per 5M rows), then O(rows in range)."""
    low, high = sorted(float(value) for value in xrange)
    whole = view_charts(view, options)[key]
    return view.memo(("zoom", options, key, low, high), lambda: _zoom_chart(view, options, key, whole, low, high))


def _zoom_chart(view: RunView, options: ChartOptions, key: str, whole: Figure, low: float, high: float) -> Figure:
    origin = pd.Timestamp(view.sessions[0].start_time) if view.sessions else None
    warmup = _warmup_rows(options)
    keep = {}
    for event in TAIL_EVENTS:
        frame = view.frames[event]
        if not len(frame) or options.x not in (*frame.columns, "time", "relative"):
            keep[event] = np.zeros(len(frame), dtype=bool)
            continue
        xs = np.asarray(x_values(frame, options.x, origin), dtype=np.float64)
        inside = (xs >= low) & (xs <= high)
        rows = np.flatnonzero(inside)
        if len(rows):  # the smoothing's warm-up and one point either side, so lines leave the frame
            inside[max(0, rows[0] - warmup) : rows[0]] = True
            inside[rows[-1] : rows[-1] + 2] = True
        keep[event] = inside
    frames, superseded = dict(view.frames), dict(view.superseded)
    for event, inside in keep.items():
        frames[event] = view.frames[event][inside].reset_index(drop=True)
        superseded[event] = view.superseded[event][inside]
    replaced = {index: rows[keep["train"]] if len(rows) == len(keep["train"]) else rows
                for index, rows in view.replaced.items()}  # fmt: skip
    window = replace(view, frames=frames, superseded=superseded, replaced=replaced, lineage=view.lineage)
    raw = run_charts(window, options).get(key)
    return whole if raw is None else _splice(whole, raw, low, high)


def _splice(whole: Figure, raw: Figure, low: float, high: float) -> Figure:
    """``whole`` with each trace's points inside [low, high] replaced by ``raw``'s trace of the
    same name and axis: panning still shows the run around the zoom, and a live update outside
    it is still drawn."""
    zoomed = {(trace.get("name"), trace.get("yaxis")): trace for trace in raw["data"]}
    data = []
    for trace in whole["data"]:
        inner = zoomed.pop((trace.get("name"), trace.get("yaxis")), None)
        if trace.get("x") is None or inner is None or inner.get("x") is None:
            data.append(trace)
            continue
        xs, inner_xs = np.asarray(trace["x"], dtype=np.float64), np.asarray(inner["x"], dtype=np.float64)
        left, right = xs < low, xs > high
        inside = (inner_xs >= low) & (inner_xs <= high)
        spliced = dict(trace)
        for name in ("x", "y", "customdata"):
            if trace.get(name) is not None and inner.get(name) is not None:
                outer, middle = np.asarray(trace[name]), np.asarray(inner[name])
                spliced[name] = np.concatenate([outer[left], middle[inside], outer[right]])
        data.append(spliced)
    data += zoomed.values()  # only in the zoomed range (a gap marker)
    return Figure(data=data, layout=whole["layout"])


def view_findings(view: RunView) -> list[Finding]:
    """The run's diagnostics, computed once per snapshot.  A live run's next snapshot extends the
    last one's at once (``diagnose(since=...)``: O(appended rows)); findings that cannot be extended
    (the pandas checks ran: odd columns) are checked again from scratch at most at
    ``REBUILD_CPU_SHARE`` of a core per run, so such a snapshot may show an earlier one's findings,
    never more than ``cost / REBUILD_CPU_SHARE`` seconds old.  Diagnostics that fail on odd data
    are themselves a finding, never a page that fails to load."""
    return view.memo("findings", lambda: _carried_findings(view))


@dataclass(frozen=True, eq=False)
class _Findings:
    records: int
    resets: int
    findings: list[Finding]
    at: float
    cost_s: float


def _carried_findings(view: RunView) -> list[Finding]:
    def update(previous: _Findings | None) -> _Findings:
        now = time.monotonic()
        grown = previous is not None and previous.resets == view.ingest.resets and previous.records <= view.records
        extensible = grown and getattr(previous.findings, "running", None) is not None
        if grown and not extensible and now - previous.at < previous.cost_s / REBUILD_CPU_SHARE:
            return previous
        start = time.perf_counter()
        findings = _diagnose(view, previous.findings if grown else None)
        return _Findings(view.records, view.ingest.resets, findings, now, time.perf_counter() - start)

    return view.lineage.carry("findings", update).findings


def _diagnose(view: RunView, since: list[Finding] | None) -> list[Finding]:
    try:
        return diagnose(train=view.frames["train"], sessions=view.sessions, replaced=view.replaced, ingest=view.ingest,
                        since=since)  # fmt: skip
    except Exception as exc:
        _log.warning("diagnostics of run %r failed", view.name, exc_info=True)
        return [Finding("error", "diagnostics", f"the checks could not run on this data: {type(exc).__name__}: {exc}")]


def chart_csv(spec: ChartSpec) -> str:
    """Exactly the rows a chart draws (raw, not downsampled, not smoothed), as CSV."""
    parts = []
    for item in spec.series:
        if item.column not in item.frame.columns:
            continue
        part = item.frame[["session_id", "step", "tokens_seen", "time", item.column]].rename(
            columns={item.column: "value"}
        )
        part.insert(0, "series", item.label)
        part.insert(1, "metric", item.column)
        part["superseded"] = item.superseded if item.superseded is not None else False
        parts.append(part)
    return pd.concat(parts).to_csv(index=False) if parts else ""


def session_overlay(view: RunView, *, x: str, smoothing: float, theme: str = "light") -> Figure:
    """The sessions page's chart: every session's loss on one axis, replay windows shaded."""
    spec = chart_specs(view, "sessions")["loss"]
    return metric_figure(
        spec.series, title="Loss by session", sessions=view.sessions, x=x, smoothing=smoothing,
        revision=f"{view.name}:sessions:{x}", highlights=replay_highlights(view, x), theme=theme,
    )  # fmt: skip


def compare_chart(
    views: Mapping[str, RunView],
    metric: str,
    *,
    x: str,
    smoothing: float,
    log_y: bool,
    theme: str = "light",
    legend: bool = True,
) -> Figure:
    """One metric of several runs (effective histories), each run a colour and named by its path;
    ``legend`` False leaves the runs' key to another chart (one colour per run on every chart)."""
    event, label = COMPARE_METRICS[metric]
    series = []
    for number, (name, view) in enumerate(views.items()):
        frame = view.effective(event)
        if metric == "tokens_per_s":
            frame = _with_throughput(frame)
        # Validation is sparse (every N steps): drawn raw with markers, as on the run page, not smoothed.
        series.append(Series(frame, metric, name, markers=event == "validation",
                             colour=RUN_COLOURS[number % len(RUN_COLOURS)]))  # fmt: skip
    figure = metric_figure(
        series, title=label, sessions=[], x=x, smoothing=smoothing, log_y=log_y,
        revision=f"compare:{metric}:{x}:{log_y}:{','.join(views)}", theme=theme,
    )  # fmt: skip
    return Figure(data=figure["data"], layout={**figure["layout"], "showlegend": legend})
