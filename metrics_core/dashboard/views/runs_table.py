"""The runs table as the runs page shows it: filtered, paged newest activity first, each run a
link to its page, statuses as coloured badges, losses with a trend.  Pure functions of the store's
runs page table; every text cell goes through ``display_text``."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from urllib.parse import quote

import pandas as pd

from metrics_core.dashboard.display_text import (
    CELL_CHARS,
    MISSING,
    age_text,
    clock_text,
    human_count,
    human_value,
    shorten_words,
    stamp_text,
)
from metrics_core.dashboard.store.rows import RUNS_TABLE_COLUMNS, TREND_POINTS
from metrics_core.dashboard.views.chart_filter import chart_filter
from metrics_core.dashboard.views.sweep import metric_value


def filter_runs(table: pd.DataFrame, pattern: str) -> tuple[pd.DataFrame, str | None]:
    """Rows whose run name matches ``pattern`` (a name filter, ``chart_filter``: no pattern can
    stall the server); a refused one filters nothing and comes back as an error message saying why
    (plain text: the page escapes it)."""
    if not pattern:
        return table, None
    try:
        kept = chart_filter(pattern, "run filter")
    except ValueError as exc:
        return table, f"{exc} Showing all runs."
    return table[table["run"].map(kept.keeps)], None


def run_link(name: str, page: str = "run") -> str:
    """Relative URL of a run's page: shareable, the name readable. Everything but letters, digits,
    ``_.-~`` and ``/`` is percent-encoded, so no name can close a markdown link, start a scheme
    or add a query parameter."""
    return f"{page}?run={quote(name, safe='/')}"


def run_links(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the page shows it: the run column as links to each run's page, long texts
    (an error reason) shortened."""
    shown = table.assign(run=table["run"].map(run_link))
    if "error" in shown.columns:
        shown["error"] = shown["error"].map(
            lambda text: shorten_words(text, CELL_CHARS) if isinstance(text, str) else None
        )
    return shown


# Marks any sans-serif font has (an emoji needs a colour-emoji font, which a cluster desktop may lack);
# the colour comes from STATUS_COLOURS, applied to the cell by the runs table's column config.
STATUS_BADGES = {
    "live": "● live",
    "stalled": "◐ stalled",
    "finished": "✓ finished",
    "interrupted": "■ interrupted",
    "failed": "✕ failed",
    "crashed": "✕ crashed",
    "error": "! error",
    "unreadable": "⊘ unreadable",
}
STATUS_COLOURS = {
    "live": "#21c354",
    "stalled": "#d4a000",
    "finished": "#1c83e1",
    "interrupted": "#ff8c00",
    "failed": "#ff2b2b",
    "crashed": "#ff2b2b",
    "error": "#ff2b2b",
    "unreadable": "#ff2b2b",
}


def status_pills(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each status badge as a one-item list: the cell of a read-only multiselect
    column (``runs_table_view.RUNS_COLUMNS``), which colours each badge by ``STATUS_COLOURS`` in the browser
    (a pandas Styler would colour them on the server and send the styles with every drawn table)."""
    return table.assign(status=table["status"].map(lambda badge: [badge]))


def status_badge(status: object) -> str:
    """A status with a coloured mark in front, readable without colour too."""
    return STATUS_BADGES.get(str(status), str(status)) if status is not None else MISSING


def trend(values: object, points: int = TREND_POINTS) -> list[float]:
    """At most ``points`` values evenly picked from a series (its last value always kept), for a
    sparkline; non-finite values dropped."""
    array = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=float)
    array = array[pd.notna(array) & (abs(array) != float("inf"))]
    if len(array) > points:
        array = array[[round(i * (len(array) - 1) / (points - 1)) for i in range(points)]]
    return [float(value) for value in array]


PAGE_ROWS = 100  # runs drawn per page: what a live update of a big root redraws and sends


def newest_first(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (the store's runs page) ordered by its last record's age, runs never read last;
    entries of the root that cannot be looked into first: they hide runs until someone fixes them,
    and would otherwise wait on the last page of a big root.  Runs of the same age go by name: the
    store's rows come in the order it read them, which changes, and a row must not move (and the
    page be redrawn under a pointer) because another run was read."""
    by_age = table.sort_values(["last record age (s)", "run"], na_position="last", kind="stable")
    return by_age.loc[(by_age["status"] != "unreadable").sort_values(kind="stable").index]


# How the runs page can order its runs (``?sort=``): the metric's two need a metric chosen.
SORTS = {
    "activity": "newest activity",
    "name": "run name",
    "best": "the metric's best",
    "last": "the metric's last",
}


def sorted_runs(table: pd.DataFrame, sort: str, *, metric: str | None = None, best_max: bool = False) -> pd.DataFrame:
    """``table`` (the store's runs page, its ``metrics`` column included) in the order ``sort``
    names (``SORTS``): newest activity first, by name, or by the ``metric``'s best or last value,
    the best first (the least, or the greatest with ``best_max``), runs without one last; ties
    keep the newest activity first.  O(runs)."""
    ordered = newest_first(table)
    if sort == "name":
        return ordered.sort_values("run", kind="stable")
    if sort in ("best", "last") and metric:
        tails = ordered["metrics"].tolist()
        values = [metric_value(tail, metric, value=sort, best_max=best_max) for tail in tails]
        key = pd.Series(values, index=ordered.index, dtype="float64")
        return ordered.loc[key.sort_values(ascending=not best_max, na_position="last", kind="stable").index]
    return ordered


def runs_page(
    table: pd.DataFrame,
    page: int,
    rows: int = PAGE_ROWS,
    *,
    order: Callable[[pd.DataFrame], pd.DataFrame] = newest_first,
) -> tuple[pd.DataFrame, int, int]:
    """Page ``page`` (from 1, clamped to the pages there are) of ``table`` in ``order`` (newest
    activity first), the page it is and how many pages there are: the runs page formats and draws
    one page, so a live update of a root of 1,000 runs costs O(``rows``) in formatting and bytes,
    O(runs) only in sorting."""
    pages = max(1, -(-len(table) // rows))
    page = min(max(page, 1), pages)
    return order(table).iloc[(page - 1) * rows : page * rows], page, pages


def readable_runs(table: pd.DataFrame, *, order: Callable[[pd.DataFrame], pd.DataFrame] = newest_first) -> pd.DataFrame:
    """The runs table as the page shows it: in ``order`` (newest activity first), status badges,
    human numbers, ages and durations as text; the run column stays the name (the page makes it a link).

    ``table`` is the store's runs table, optionally with ``started`` (a datetime), ``duration (s)``
    and ``loss trend`` (a sequence of floats) per run.
    """
    table = order(table)
    shown = pd.DataFrame({"run": table["run"], "status": table["status"].map(status_badge)})
    if "progress" in table.columns and table["progress"].notna().any():  # runs being read: how far each came
        shown["progress"] = table["progress"].map(lambda text: text if isinstance(text, str) else "")
    if "loss trend" in table.columns:
        points = (list, tuple, array)  # the store's rows hold an array of doubles (``rows.LossTrend``)
        shown["loss trend"] = table["loss trend"].map(lambda value: list(value) if isinstance(value, points) else [])
    shown["train loss"] = table["train loss"].map(human_value)
    shown["val loss"] = table["val loss"].map(human_value)
    shown["last activity"] = table["last record age (s)"].map(age_text)
    if "started" in table.columns:
        shown["started"] = table["started"].map(stamp_text)
    if "duration (s)" in table.columns:
        shown["duration"] = table["duration (s)"].map(clock_text)
    shown["sessions"] = table["sessions"].map(human_count)
    shown["last step"] = table["last step"].map(human_count)
    shown["tokens seen"] = table["tokens seen"].map(human_count)
    shown["skipped updates"] = table["skipped updates"].map(human_count)
    shown["bad lines"] = table["bad lines"].map(human_count)
    # One column says what went wrong: a run that cannot be read has its error, a run that
    # stopped has its reason (the exception, the signal, the failing rank); never both.  Where no
    # listed run has either, no column: an empty one would push the table past a 1,400 px window.
    reason = table["reason"] if "reason" in table.columns else pd.Series(None, index=table.index)
    errors = [
        _cell_text(error if isinstance(error, str) else why) for error, why in zip(table["error"], reason, strict=True)
    ]
    if any(errors):
        shown["error"] = errors
    # Config keys and a metric's values next to the run: a sweep's settings and results side by side.
    # Numbers read as the losses beside them do (four significant digits), a missing value as "—".
    extra = [column for column in table.columns if column not in RUNS_TABLE_KNOWN]
    for column in extra:
        shown[column] = table[column].map(_extra_cell)
    return shown[["run", "status", *extra, *shown.columns[2 : len(shown.columns) - len(extra)]]].reset_index(drop=True)


def _extra_cell(value: object) -> object:
    """A config value (text) or a metric's value (a number) as the runs table shows it."""
    return value if isinstance(value, str) else human_value(value)


def _cell_text(text: object) -> str:
    return shorten_words(text, CELL_CHARS) if isinstance(text, str) else ""


RUNS_TABLE_KNOWN = frozenset({*RUNS_TABLE_COLUMNS, "last record time"})
