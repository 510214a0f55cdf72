"""What the pages chart: pure functions of ``RunView`` snapshots and page options to chart specs.

``spec_makers`` picks, per chart of the run page (the defaults in ``DEFAULT_CHARTS``, then one per
key the run logged), the rows and columns it draws (per history mode:
the effective history, every session with superseded records dimmed, or sessions overlaid with
their replays shaded), as ``ChartSpec``s of ``Series`` (their rows as CSV: ``views.chart_csv``; the
compare page's series are ``views.compare``'s): each a call, so a page drawing a big run's charts
one by one shows the first before the others' rows are found.  ``chart_specs`` makes them all at
once, for a caller that draws them all, reading the snapshot's rows once for all of them (the same
specs, one frame per event).  This is the views layer: it reads snapshots
(``store.snapshot``) and knows nothing of figures: ``figures.run_charts`` draws the specs.  Nothing
here memoises: ``views.memo`` keeps the chart list and findings per snapshot, ``figures.chart_memo``
the figures.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass
from functools import cache, cached_property, partial
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from metrics_core.analysis.derived import tokens_per_second
from metrics_core.dashboard.store.snapshot import RunView
from metrics_core.dashboard.views.chart_filter import chart_picks
from metrics_core.dashboard.views.x_keys import X_MODES, column_numbers, fill_x

HISTORY_MODES = {
    "effective": "effective history",
    "all": "all sessions (superseded dimmed)",
    "sessions": "sessions overlaid, replays shaded",
}
MAX_LOGGED_CHARTS = 8  # charts of logged keys drawn at once: a narrower filter shows the others
# The smoothing slider's range, step and start: the only smoothings a page asks for (``smoothing_error``).
SMOOTHING_MAX = 0.99
SMOOTHING_STEP = 0.01
SMOOTHING_DEFAULT = 0.6


def smoothing_error(smoothing: float) -> str | None:
    """Why a page may not ask for ``smoothing`` (the slider's values only: each one a chart the
    live answers may hold), or None."""
    steps = smoothing / SMOOTHING_STEP
    if 0 <= smoothing <= SMOOTHING_MAX and abs(steps - round(steps)) < 1e-6:
        return None
    return f"smoothing must be a multiple of {SMOOTHING_STEP} from 0 to {SMOOTHING_MAX}"


@dataclass(frozen=True)
class ChartOptions:
    """What the run page's controls choose, and the browser's theme ("light"/"dark", ``THEMES``).

    ``only`` is the chart filter (``chart_filter``: terms, not a regular expression), matched
    against chart titles and keys (``pick_charts``): the charts it leaves out are not built, and
    cost nothing per update.
    The theme is part of every memo and lineage key the options are (``key``), so a dark tab and a
    light tab each get their own figures, built coloured (no recoloured copy per snapshot).
    """

    x: str = "step"
    smoothing: float = 0.0
    log_y: bool = False
    history: str = "effective"
    theme: str = "light"
    only: str = ""

    @cached_property
    def key(self) -> tuple[Any, ...]:
        """The options as a memo key: a tuple of plain values, which the snapshot's memo hashes
        without calling back into this module (a dataclass's ``__hash__`` is code of this module)."""
        return astuple(self)


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a chart: ``column`` of ``event``'s records, called ``label``; the rest as ``Series``."""

    event: str
    column: str
    label: str
    markers: bool = False
    gap_markers: bool = False
    secondary_y: bool = False


@dataclass(frozen=True, slots=True)
class Chart:
    """A chart the run page may draw: what it shows, and whether smoothing and a log scale apply.

    ``group`` is the heading it is shown under ("" for the charts every run opens with).
    """

    key: str
    title: str
    lines: tuple[Line, ...]
    smoothed: bool
    loggable: bool
    group: str = ""


# The charts every run opens with, in this order; every other logged number joins them below
# (``logged_charts``).
DEFAULT_CHARTS = (
    Chart(
        "loss",
        "Loss",
        (Line("train", "train_loss", "train"), Line("validation", "val_loss", "validation", markers=True)),
        True,
        True,
    ),
    Chart(
        "clipped", "Clipped fraction", (Line("train", "clipped_fraction", "clipped", gap_markers=True),), False, False
    ),
    Chart(
        "skipped",
        "Skipped updates",
        (
            Line("train", "skipped_updates_in_window", "per window"),
            Line("train", "skipped_updates", "cumulative", secondary_y=True),
        ),
        False,
        False,
    ),
    Chart(
        "grad_norm",
        "Gradient norm (pre-clip)",
        (Line("train", "grad_norm_avg", "avg", gap_markers=True), Line("train", "grad_norm_max", "max")),
        True,
        True,
    ),
    Chart("lr", "Learning rate", (Line("train", "lr", "lr"),), False, True),
    Chart("throughput", "Throughput (tokens/s)", (Line("train", "tokens_per_s", "tokens/s"),), True, False),
)
# The writer's own fields: the default charts draw what they mean, so none is charted as a logged
# key (``logged_keys``); a key outside this set is the user's.
WRITER_FIELDS = frozenset(
    {
        "schema_version",
        "time",
        "run_id",
        "session_id",
        "event",
        "step",
        "tokens_seen",
        "skipped_updates",
        "train_loss",
        "lr",
        "tokens",
        "attempted_updates",
        "updates",
        "skipped_updates_in_window",
        "grad_norm_avg",
        "grad_norm_max",
        "clipped_fraction",
        "nonfinite_grad_norms",
        "nonfinite_loss",
        "val_loss",
        "val_tokens",
        "world_size",
        "slowest_rank",
        "ranks_in_lockstep",
        "rank_step_time_min_s",
        "rank_step_time_max_s",
        "rank_tokens_per_s_min",
        "rank_tokens_per_s_max",
    }
)
CHARTED_EVENTS = ("train", "validation")
RANK_KEY = re.compile(r"(?P<base>.+)/rank(?P<rank>\d+)")
# What ``metric_figure`` reads of a line's frame besides the line's column: its x axes and sessions.
LINE_FIELDS = frozenset({"session_id", "step", "tokens_seen", "time"})
# Columns computed from others for a chart, never logged as such.
DERIVED = {"tokens_per_s": tokens_per_second}


@dataclass(frozen=True, slots=True)
class Series:
    """One quantity to draw: ``column`` of ``frame``, called ``label``.

    ``superseded`` marks rows a later session redid (drawn dimmed); ``None`` means none are.
    ``gap_markers`` marks rows where the value is missing (e.g. no successful update).
    ``colour`` set: one trace in that colour named ``label`` (comparing runs), instead of one
    trace per session in the session's colour.
    """

    frame: pd.DataFrame
    column: str
    label: str
    superseded: np.ndarray | None = None
    secondary_y: bool = False
    gap_markers: bool = False
    markers: bool = False
    colour: str | None = None


STRAGGLER_TITLE = "Rank step time (fastest to slowest rank)"


def is_distributed(frame: pd.DataFrame) -> bool:
    """Whether any record of ``frame`` comes from a data-parallel job of more than one rank."""
    if "world_size" not in frame.columns:
        return False
    return bool((pd.to_numeric(frame["world_size"], errors="coerce") > 1).any())


def rank_time_ratio(frame: pd.DataFrame) -> np.ndarray:
    """Per window, the slowest rank's time per step over the fastest's (NaN where either is missing):
    the straggler chart draws it and its CSV holds it."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = column_numbers(frame, "rank_step_time_max_s") / column_numbers(frame, "rank_step_time_min_s")
    return np.where(np.isfinite(ratio), ratio, np.nan)


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
    group: str = ""


def logged_keys(view: RunView) -> dict[str, tuple[str, ...]]:
    """Every numeric key of the run's train and validation records that is not one of the writer's
    own fields, with the events it appears in: the numbers the user logged (``mfu``, ``val/acc``)."""
    keys: dict[str, tuple[str, ...]] = {}
    for event in CHARTED_EVENTS:
        for column, kind in view.columns[event].kinds().items():
            # integers and floats: booleans, categories, times and mixed values are no chart's numbers
            if column not in WRITER_FIELDS and kind in "iuf":
                keys[column] = (*keys.get(column, ()), event)
    return keys


def logged_charts(view: RunView) -> list[Chart]:
    """A chart per logged key (``logged_keys``): ``key_charts`` of them."""
    return key_charts(logged_keys(view))


def key_charts(keys: Mapping[str, tuple[str, ...]]) -> list[Chart]:
    """A chart per key of ``keys`` (key -> the events logging it), grouped by the part of the key
    before its first "/" (``val/acc`` under "val", as TensorBoard groups tags), else by the event
    that logs it; sorted by group, then key.  Keys that differ only in a last ``/rank<N>`` part (the
    per-rank ``sys/<field>/rank<N>`` of ``metrics_core.write.system_sampler``) share one chart, a line per rank."""
    per_rank: dict[str, list[tuple[int, str, tuple[str, ...]]]] = {}
    charts = []
    for column, events in keys.items():
        ranked = RANK_KEY.fullmatch(column)
        if ranked is not None:
            per_rank.setdefault(ranked["base"], []).append((int(ranked["rank"]), column, events))
            continue
        lines = tuple(Line(event, column, event, markers=event == "validation") for event in events)
        charts.append(_logged_chart(column, events, lines))
    for base, ranks in per_rank.items():
        lines = tuple(Line(events[0], column, f"rank {rank}") for rank, column, events in sorted(ranks))
        charts.append(_logged_chart(base, ranks[0][2], lines))
    return sorted(charts, key=lambda chart: (chart.group, chart.title))


def _logged_chart(column: str, events: tuple[str, ...], lines: tuple[Line, ...]) -> Chart:
    group = column.split("/", 1)[0] if "/" in column.strip("/") else events[0]
    return Chart(f"key:{column}", column, lines, smoothed=events[0] == "train", loggable=True, group=group)


def charts_of(view: RunView, keys: Mapping[str, tuple[str, ...]] | None = None) -> list[Chart]:
    """Every chart of the run page, the defaults first; ``keys``: ``logged_keys(view)``, where the
    caller has it."""
    return [*DEFAULT_CHARTS, *key_charts(logged_keys(view) if keys is None else keys)]


def pick_charts(charts: Sequence[Chart], pattern: str) -> tuple[list[Chart], int]:
    """The charts ``pattern`` keeps (``chart_filter.chart_filter``: matched against title and key;
    a refused pattern keeps all), at most ``MAX_LOGGED_CHARTS`` of logged keys among them; and how
    many of the logged keys' charts matched in all."""
    picks = chart_picks(pattern, [(chart.title, chart.key) for chart in charts])
    kept = [chart for chart, picked in zip(charts, picks, strict=True) if picked]
    defaults = [chart for chart in kept if not chart.group]
    logged = [chart for chart in kept if chart.group]
    return defaults + logged[:MAX_LOGGED_CHARTS], len(logged)


_Drawn = TypeVar("_Drawn")


def grouped_figures(
    view: RunView, options: ChartOptions, figures: Mapping[str, _Drawn], *, charts: Sequence[Chart] | None = None
) -> tuple[dict[str, dict[str, _Drawn]], int]:
    """``figures`` (by chart key, in ``spec_makers``' order) under their headings ("" first: the
    defaults and the straggler chart), and how many logged keys' charts the filter matched in all.
    ``charts``: ``charts_of(view)``, where the caller has it."""
    picked, logged = pick_charts(charts_of(view) if charts is None else charts, options.only)
    group = {chart.key: chart.group for chart in picked}
    groups: dict[str, dict[str, _Drawn]] = {}
    for key, figure in figures.items():
        groups.setdefault(group.get(key, ""), {})[key] = figure
    return groups, logged


def with_derived(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    if column in DERIVED and column not in frame.columns and len(frame):
        # concat, not assign: a run logging hundreds of keys has a frame of as many blocks, which
        # assign would copy whole (pandas warns of it) to add one column.
        return pd.concat([frame, pd.Series(DERIVED[column](frame), index=frame.index, name=column)], axis=1)
    return frame


def chart_fields(charts: Sequence[Chart]) -> frozenset[str]:
    """The fields a frame must hold to draw ``charts``: what a line is drawn from (``LINE_FIELDS``)
    and their columns (a derived one is the snapshot's own, extended per append).  A run's other
    fields stay out: each column a frame holds costs a check per snapshot, and on a run a later
    session redid, the effective rows of each field an O(rows) pick."""
    return LINE_FIELDS.union(line.column for chart in charts for line in chart.lines)


_Rows = dict[str, tuple[pd.DataFrame, np.ndarray | None]]


def _rows_of(
    view: RunView, history: str, fields: frozenset[str], x: str = "step", events: Sequence[str] = CHARTED_EVENTS
) -> _Rows:
    """Per event of ``events``, the rows a history mode draws (their ``fields``, and a logged key ``x``,
    filled in where a record lacks it: ``fill_x``), and which of them to dim."""
    if x not in X_MODES:
        fields = fields | {x}
    if history == "effective":
        rows = {event: (view.effective(event, fields), None) for event in events}
    else:
        rows = {
            event: (view.frame(event, fields), view.superseded[event] if history == "all" else None) for event in events
        }
    if x not in X_MODES:
        train = view.effective("train", ("step", x))
        rows = {event: (fill_x(frame, x, train), dim) for event, (frame, dim) in rows.items()}
    return rows


def spec_makers(
    view: RunView, history: str, *, only: str = "", charts: Sequence[Chart] | None = None, x: str = "step"
) -> dict[str, Callable[[], ChartSpec]]:
    """The charts ``only`` keeps (``pick_charts``) of ``charts`` (default ``charts_of(view)``),
    keyed by chart key, each a call that finds its rows for ``history`` (holding ``x`` when it is a
    logged key); and for a data-parallel run (``world_size`` > 1), the ranks' step-time spread.
    A default chart finds only its own fields' rows, so a big run's first chart does not wait for
    every other's; the logged keys' charts share one frame, found for the first of them."""
    picked = pick_charts(charts_of(view) if charts is None else charts, only)[0]
    defaults, logged = [chart for chart in picked if not chart.group], [chart for chart in picked if chart.group]
    makers: dict[str, Callable[[], ChartSpec]] = {
        chart.key: partial(chart_spec, view, chart, history, x=x) for chart in defaults
    }
    if is_distributed(view.frame("train", ("world_size",))):
        makers["straggler"] = partial(_straggler_spec, view, history, x)
    shared = cache(partial(_rows_of, view, history, chart_fields(logged), x))
    return makers | {chart.key: partial(_shared_spec, shared, chart) for chart in logged}


def chart_specs(
    view: RunView, history: str, *, only: str = "", charts: Sequence[Chart] | None = None, x: str = "step"
) -> dict[str, ChartSpec]:
    """What ``spec_makers`` makes, made at once for a caller that draws every chart: the rows of all
    the charts found in one pass over the snapshot (one frame per event, of all their fields)."""
    picked = pick_charts(charts_of(view) if charts is None else charts, only)[0]
    rows = _rows_of(view, history, chart_fields(picked), x)
    specs = {chart.key: _spec(rows, chart) for chart in picked if not chart.group}
    if is_distributed(view.frame("train", ("world_size",))):
        specs["straggler"] = _straggler_spec(view, history, x)
    return specs | {chart.key: _spec(rows, chart) for chart in picked if chart.group}


def chart_spec(view: RunView, chart: Chart, history: str, *, x: str = "step") -> ChartSpec:
    """``chart`` with its rows for ``history`` (holding ``x`` when it is a logged key)."""
    events = tuple(dict.fromkeys(line.event for line in chart.lines))
    return _spec(_rows_of(view, history, chart_fields([chart]), x, events), chart)


STRAGGLER_FIELDS = LINE_FIELDS | {"rank_step_time_min_s", "rank_step_time_max_s", "slowest_rank", "ranks_in_lockstep"}


def _straggler_spec(view: RunView, history: str, x: str) -> ChartSpec:
    train, dim = _rows_of(view, history, STRAGGLER_FIELDS, x, ("train",))["train"]
    ranks = train.assign(rank_step_time_ratio=rank_time_ratio(train))
    return ChartSpec(
        STRAGGLER_TITLE,
        [
            Series(ranks, "rank_step_time_min_s", "fastest rank's time", dim),
            Series(ranks, "rank_step_time_max_s", "slowest rank's time", dim),
            Series(ranks, "rank_step_time_ratio", "slowest / fastest", dim),
            Series(ranks, "slowest_rank", "slowest rank", dim),
            Series(ranks, "ranks_in_lockstep", "ranks in lockstep", dim),
        ],
        False,
        False,
        kind="straggler",
    )


def _shared_spec(rows: Callable[[], _Rows], chart: Chart) -> ChartSpec:
    return _spec(rows(), chart)


def _spec(rows: Mapping[str, tuple[pd.DataFrame, np.ndarray | None]], chart: Chart) -> ChartSpec:
    series = [
        Series(
            with_derived(rows[line.event][0], line.column),
            line.column,
            line.label,
            rows[line.event][1],
            secondary_y=line.secondary_y,
            gap_markers=line.gap_markers,
            markers=line.markers,
        )
        for line in chart.lines
    ]
    return ChartSpec(chart.title, series, chart.smoothed, chart.loggable, group=chart.group)


def chart_key(key: str) -> str:
    """The Streamlit key of the run page's live chart ``key`` (its element carries the class
    ``st-key-<that>``)."""
    return f"chart_{key}"


def chart_keys(keys: Iterable[str]) -> list[str]:
    """``chart_key`` of each of ``keys``, in order."""
    return [chart_key(key) for key in keys]


EMA_FORGET = 1e-7  # the smoothing's warm-up: rows until the start's weight falls below this


def warmup_rows(options: ChartOptions) -> int:
    """Rows before the first new one that a chart of a tail needs: the smoothing's memory, and one
    row for the throughput's difference."""
    if options.smoothing <= 0:
        return 2
    return int(np.ceil(np.log(EMA_FORGET) / np.log(options.smoothing))) + 2
