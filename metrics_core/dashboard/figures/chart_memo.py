"""The run page's figures, memoised per snapshot and carried along a live run.

Every tab of a page asks for the same snapshot's charts; they are drawn once per snapshot and
options (kept in ``RunView.kept``) and, on a live run, from the previous snapshot's (``RunView.lineage``),
so a refresh pays for the appended records, not the whole run (each run keeps those of the
options asked for last, ``snapshot.BOUNDED_KEPT``: a client may ask for any number of options):

* ``view_charts``: the run page's charts.  A full build min/max-downsamples the whole run
  (``run_charts``); a live update then draws its records raw on top of that base, computed
  from a tail of the run just long enough for the smoothing to forget where it started (every new
  point and its smoothed value exact to ``chart_specs.EMA_FORGET``), until the raw tail is long or
  old enough to fold into a new full build.  A run shorter than ``INCREMENTAL_FROM_ROWS`` is always
  built whole.  Full builds take at most ``views.memo.REBUILD_CPU_SHARE`` of a core.
* ``view_chart_groups``: those charts under their headings.
* ``view_chart_grid``: the same grid for a page that draws it chart by chart: on a first build
  each chart is drawn when the page asks for it, so a big run's first chart is shown while the
  others are drawn.
* ``zoom_chart``: a chart drawn from only the records in the x-range the user zoomed to.
* ``view_session_overlay``: the sessions page's chart.

Calls go one way: down into the views (the chart list, ``views.memo``, unless the caller hands
it down; the specs, through ``run_charts``) and the snapshot, which keeps the values this module
computes and calls nothing back.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.dashboard.figures.figure_dicts import Figure
from metrics_core.dashboard.figures.layout import x_values
from metrics_core.dashboard.figures.metric_axes import OFF_SCALE
from metrics_core.dashboard.figures.run_charts import chart_builders, run_charts, session_overlay
from metrics_core.dashboard.store.snapshot import EMPTY, RunView
from metrics_core.dashboard.views.chart_specs import Chart, ChartOptions, grouped_figures, warmup_rows
from metrics_core.dashboard.views.memo import REBUILD_CPU_SHARE, view_charts_of

INCREMENTAL_FROM_ROWS = 20_000  # below this a full build is cheap enough to do every time: always exact
TAIL_REBUILD_ROWS = 2_000  # appended rows drawn raw before the next full build
TAIL_REBUILD_S = 120.0
TAIL_EVENTS = ("train", "validation")


def _once(view: RunView, key: Hashable, compute: Callable[[], Any]) -> Any:
    """``compute()`` (a function of this module) once per snapshot and ``key``, one of many
    (``snapshot.BOUNDED_KEPT`` are kept)."""
    kept = view.kept(key, bounded=True)
    with kept.lock:
        if kept.value is EMPTY:
            kept.value = compute()
        return kept.value


def view_charts(view: RunView, options: ChartOptions, charts: list[Chart] | None = None) -> dict[str, Figure]:
    """The run page's charts, once per snapshot and options, shared by every tab.  ``charts``:
    ``views.memo.view_charts_of(view)``, where the caller has it.

    On a long live run they are extended, not rebuilt (``_extend_charts``): cost O(appended
    records + smoothing warm-up), where ``run_charts`` costs O(records).
    """
    charts = view_charts_of(view) if charts is None else charts
    return _once(view, ("charts", options.key), lambda: _carried_charts(view, options, charts))


@dataclass(frozen=True, eq=False)
class _Charts:
    """The charts of ``view``, and the full build they extend (``base``), with its clock and cost."""

    view: RunView
    figures: dict[str, Figure]
    base: RunView
    built_at: float
    cost_s: float


def view_chart_groups(
    view: RunView, options: ChartOptions, charts: list[Chart] | None = None
) -> tuple[dict[str, dict[str, Figure]], int]:
    """``chart_specs.grouped_figures`` of ``view_charts``, once per snapshot and options: finding the
    logged keys walks every column of the run's frames, which a tab's refresh need not repeat.
    ``charts``: ``views.memo.view_charts_of(view)``, where the caller has it."""
    charts = view_charts_of(view) if charts is None else charts
    figures = view_charts(view, options, charts)
    return _once(view, ("groups", options.key), lambda: grouped_figures(view, options, figures, charts=charts))


@dataclass(frozen=True)
class ChartGrid:
    """What the run page's grid draws: the chart keys under their headings (``view_chart_groups``),
    how many logged keys' charts the filter matched, and each chart's figure by key."""

    groups: dict[str, list[str]]
    logged: int
    figure: Callable[[str], Figure]


def view_chart_grid(view: RunView, options: ChartOptions) -> ChartGrid:
    """``view_chart_groups`` for a page that draws the charts one at a time.  Where the lineage
    carries these options' charts they come whole (``view_charts``: a live update extends them);
    on a first build (a run just read, options just picked) each is drawn when the page asks for
    it, so the first is shown while the others are drawn, and ``view_charts`` takes the same ones."""
    charts = view_charts_of(view)
    if view.lineage.holds(("charts", options.key)):
        groups, logged = view_chart_groups(view, options, charts)
        figure = {key: figure for keyed in groups.values() for key, figure in keyed.items()}.__getitem__
    else:
        build = _full_build(view, options, charts, whole=False)
        groups, logged = grouped_figures(view, options, dict.fromkeys(build.keys), charts=charts)
        figure = build.figure
    return ChartGrid({group: list(keyed) for group, keyed in groups.items()}, logged, figure)


class _Build:
    """The run page's charts of one snapshot and options, each drawn once whichever thread asks:
    the tabs drawing them one by one and the lineage's full build share them.  Drawn one at a time
    when first asked for (``_lazy_build``: a page's first chart shown while the others are drawn),
    or all at once (``_whole_build``: their rows read in one pass).  ``cost_s``: the time drawing
    them took, however many threads asked."""

    def __init__(self, builders: dict[str, Callable[[], Figure]], figures: dict[str, Figure], cost_s: float) -> None:
        self._builders = builders
        self._figures = figures
        self.keys = tuple(builders or figures)
        self.cost_s = cost_s
        self._lock = threading.Lock()

    def figure(self, key: str) -> Figure:
        with self._lock:
            found = self._figures.get(key)
            if found is None:
                start = time.perf_counter()
                found = self._figures[key] = self._builders[key]()
                del self._builders[key]  # its rows are the snapshot's to keep, no longer this build's
                self.cost_s += time.perf_counter() - start
            return found

    def figures(self) -> dict[str, Figure]:
        return {key: self.figure(key) for key in self.keys}


def _lazy_build(view: RunView, options: ChartOptions, charts: list[Chart]) -> _Build:
    start = time.perf_counter()
    # Through a weak proxy: the snapshot's memo holds this build, and one a page left half
    # drawn must not hold the snapshot in a cycle, which only the garbage collector frees.
    builders = chart_builders(weakref.proxy(view), options, charts=charts)
    return _Build(builders, {}, time.perf_counter() - start)


def _whole_build(view: RunView, options: ChartOptions, charts: list[Chart]) -> _Build:
    start = time.perf_counter()
    figures = run_charts(view, options, charts=charts)
    return _Build({}, figures, time.perf_counter() - start)


def _full_build(view: RunView, options: ChartOptions, charts: list[Chart], *, whole: bool) -> _Build:
    """The build of ``view``'s charts with ``options`` that every caller shares: the first caller
    chooses it drawn ``whole`` or one chart at a time."""
    build = _whole_build if whole else _lazy_build
    return _once(view, ("build", options.key), lambda: build(view, options, charts))


def _carried_charts(view: RunView, options: ChartOptions, charts: list[Chart]) -> dict[str, Figure]:
    stale: list[bool] = []

    def update(previous: _Charts | None) -> _Charts:
        if previous is not None and view.records < previous.view.records:
            stale.append(True)  # a tab still holding an older snapshot: leave the lineage alone
            return previous
        if previous is not None and previous.view is view:
            return previous
        extended = _extend_charts(previous, view, options, charts) if previous is not None else None
        if extended is not None:
            return extended
        build = _full_build(view, options, charts, whole=True)
        figures = build.figures()
        return _Charts(view, figures, view, time.monotonic(), build.cost_s)

    kept = view.lineage.kept(("charts", options.key), bounded=True)
    with kept.lock:
        carried = kept.value = update(None if kept.value is EMPTY else kept.value)
    return run_charts(view, options, charts=charts) if stale else carried.figures


def _extend_charts(previous: _Charts, view: RunView, options: ChartOptions, charts: list[Chart]) -> _Charts | None:
    """``previous`` plus ``view``'s appended records (of ``charts``, ``view_charts_of(view)``), or
    None when only a full build will do."""
    base = previous.base
    rows = {event: base.rows(event) for event in TAIL_EVENTS}
    if (
        options.history == "sessions"  # replay shading follows the data
        or max(rows.values()) < INCREMENTAL_FROM_ROWS
        or len(view.sessions) != len(base.sessions)
        or view.ingest.resets != base.ingest.resets
        or any(view.rows(event) < rows[event] for event in TAIL_EVENTS)
    ):
        return None
    appended = sum(view.rows(event) - rows[event] for event in TAIL_EVENTS)
    age = time.monotonic() - previous.built_at
    if appended > TAIL_REBUILD_ROWS or age > max(TAIL_REBUILD_S, previous.cost_s / REBUILD_CPU_SHARE):
        return None
    for event in TAIL_EVENTS:  # an old record newly superseded changes old points: O(rows), vectorised
        if not np.array_equal(view.superseded[event][: rows[event]], base.superseded[event]):
            return None
    warmup = warmup_rows(options)
    # From the previous snapshot on, not the base: each update pays for its own records only.
    starts = {event: max(0, min(previous.view.rows(event), view.rows(event)) - warmup) for event in TAIL_EVENTS}
    tail = _tail_view(view, starts)
    tail_figures = run_charts(tail, options, max_points=10 * (warmup + TAIL_REBUILD_ROWS), charts=charts)
    if tail_figures.keys() - previous.figures.keys():
        return None  # a key logged for the first time: its chart joins at a full build
    figures = {}
    for key, figure in previous.figures.items():
        grown = _append_points(figure, tail_figures.get(key))
        if grown is None:
            return None
        figures[key] = grown
    return _Charts(view, figures, base, previous.built_at, previous.cost_s)


def _tail_view(view: RunView, starts: Mapping[str, int]) -> RunView:
    """``view`` with only the rows of ``starts``' events from those positions on (the others whole)."""
    columns, superseded = dict(view.columns), dict(view.superseded)
    for event, start in starts.items():
        columns[event] = view.columns[event].picked(slice(start, None))
        superseded[event] = view.superseded[event][start:]
    redone = view.redone_by[starts["train"] :]
    return replace(view, columns=columns, superseded=superseded, redone_by=redone, lineage=view.lineage)


def _append_points(figure: Figure, tail: Figure | None) -> Figure | None:
    """``figure`` with each trace extended by the points of ``tail``'s trace of the same name and
    axis that lie beyond its last x; None when a tail trace with new points has no counterpart."""
    if tail is None:
        return None
    traces = {(trace.get("name"), trace.get("yaxis")): number for number, trace in enumerate(figure["data"])}
    grown: dict[int, dict[str, np.ndarray]] = {}
    for trace in tail["data"]:
        if trace.get("meta") == OFF_SCALE:
            continue  # placed by the tail's own y-range: the next full build marks the run's
        xs = np.asarray(trace["x"]) if trace.get("x") is not None else np.zeros(0)
        if xs.dtype == object and all(x is None for x in xs.tolist()):
            continue  # a legend entry (``series_traces.legend_entry``): its one null point is all it has
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


def view_session_overlay(view: RunView, *, chart: Chart, x: str, smoothing: float, theme: str) -> Figure:
    """The sessions page's chart (``run_charts.session_overlay``), once per snapshot and controls."""
    key = ("overlay", chart.key, x, smoothing, theme)
    return _once(view, key, lambda: session_overlay(view, chart=chart, x=x, smoothing=smoothing, theme=theme))


def zoom_chart(view: RunView, options: ChartOptions, key: str, xrange: tuple[float, float]) -> Figure:
    """Chart ``key`` drawn from only the records whose x lies in ``xrange`` (plus the smoothing's
    warm-up before it), so a zoom into 1,000 records of a 5M-record run shows every one of them
    raw; downsampled only beyond the chart's point budget.  Once per snapshot, options and range.
    Cost: one O(rows) vectorised mask per event, then O(rows in range)."""
    low, high = sorted(float(value) for value in xrange)
    whole = view_charts(view, options)[key]
    return _once(view, ("zoom", options.key, key, low, high), lambda: _zoom_chart(view, options, key, whole, low, high))


def _zoom_chart(view: RunView, options: ChartOptions, key: str, whole: Figure, low: float, high: float) -> Figure:
    origin = pd.Timestamp(view.sessions[0].start_time) if view.sessions else None
    warmup = warmup_rows(options)
    keep = {}
    for event in TAIL_EVENTS:
        frame = view.frame(event, (options.x, "time"))
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
    columns, superseded = dict(view.columns), dict(view.superseded)
    for event, inside in keep.items():
        columns[event] = view.columns[event].picked(inside)
        superseded[event] = view.superseded[event][inside]
    redone = view.redone_by[keep["train"]] if len(view.redone_by) == len(keep["train"]) else view.redone_by
    window = replace(view, columns=columns, superseded=superseded, redone_by=redone, lineage=view.lineage)
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
