"""What the pages show of a snapshot that is not a figure, memoised per snapshot and carried along
a live run.

Every tab of a page asks for the same snapshot's chart list and findings; each is computed once
per snapshot (kept in ``RunView.kept``) and, on a live run, from the previous snapshot's
(``RunView.lineage``), so a refresh pays for the appended records, not the whole run.  The
snapshot keeps the values; this module computes them (a memo that calls nothing back):

* ``view_charts_of``: the run page's charts (``chart_specs.charts_of``), the same list while the
  logged keys stay the same.
* ``view_findings``: the run's diagnostics, extended per snapshot (``diagnose(since=...)``).
* ``view_x_keys``: the logged keys that can be the x axis (``x_keys.growing_keys``).
* ``view_page``: the first two at once, as the live feed hands them down to the figures.

Diagnostics from scratch, and full builds of a live run's charts (``figures.chart_memo``), take at
most ``REBUILD_CPU_SHARE`` of a core each: the rate of rebuilds is their cost over that share.
The figures themselves are memoised a layer up, in ``figures.chart_memo``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from metrics_core.analysis.diagnostics import Finding, diagnose
from metrics_core.analysis.loss_checks import CHECKED_FIELDS
from metrics_core.dashboard.store.snapshot import EMPTY, RunView
from metrics_core.dashboard.views.chart_specs import Chart, charts_of, logged_keys
from metrics_core.dashboard.views.x_keys import growing_keys

_log = logging.getLogger(__name__)
REBUILD_CPU_SHARE = 0.02


@dataclass(frozen=True)
class PageViews:
    """What the run page shows of a snapshot besides its figures, in one call: its charts
    (``view_charts_of``) and its findings (``view_findings``)."""

    charts: list[Chart]
    findings: list[Finding]


def view_page(view: RunView) -> PageViews:
    """``view_charts_of`` and ``view_findings`` at once: what the live feed and the run page's
    figures need of the views, handed down to them as values."""
    return PageViews(view_charts_of(view), view_findings(view))


def _once(view: RunView, key: str, compute: Callable[[RunView], Any]) -> Any:
    """``compute(view)`` (a function of this module) once per snapshot and ``key``."""
    kept = view.kept(key)
    with kept.lock:
        if kept.value is EMPTY:
            kept.value = compute(view)
        return kept.value


def _carry(view: RunView, key: str, update: Callable[[Any], Any]) -> Any:
    """The lineage's state under ``key`` replaced by ``update(it or None)``, and returned."""
    kept = view.lineage.kept(key)
    with kept.lock:
        kept.value = update(None if kept.value is EMPTY else kept.value)
        return kept.value


def view_charts_of(view: RunView) -> list[Chart]:
    """``chart_specs.charts_of``, once per snapshot, and the same list while the logged keys stay the
    same: the charts, their groups and their CSVs all ask for it, and making a chart per key of a
    run that logs hundreds of them is most of its cost."""
    return _once(view, "charts_of", _carried_charts_of)


def view_x_keys(view: RunView) -> tuple[str, ...]:
    """The keys of the run's train records that grow within each session (``x_keys.growing_keys``),
    once per snapshot: the run and compare pages offer them as x."""
    return _once(view, "x_keys", _carried_x_keys)


def _carried_x_keys(view: RunView) -> tuple[str, ...]:
    """``growing_keys``, with the answers for the keys held sparse carried from the last snapshot:
    a key whose values did not change keeps its answer (a live append adds none to most)."""
    keys = [key for key, events in _logged_keys(view).items() if "train" in events]

    def update(known: tuple[tuple[str, ...], dict] | None) -> tuple[tuple[str, ...], dict]:
        answers = {} if known is None else known[1]
        return growing_keys(view.columns["train"], keys, answers), answers

    return _carry(view, "x_keys", update)[0]


def _logged_keys(view: RunView) -> dict[str, tuple[str, ...]]:
    """``chart_specs.logged_keys``, once per snapshot: the charts and the x keys both ask."""
    return _once(view, "logged_keys", logged_keys)


def _carried_charts_of(view: RunView) -> list[Chart]:
    keys = _logged_keys(view)

    def update(previous: tuple[dict[str, tuple[str, ...]], list[Chart]] | None) -> tuple[dict, list[Chart]]:
        return previous if previous is not None and previous[0] == keys else (keys, charts_of(view, keys))

    return _carry(view, "charts_of", update)[1]


def view_findings(view: RunView) -> list[Finding]:
    """The run's diagnostics, computed once per snapshot.  A live run's next snapshot extends the
    last one's at once (``diagnose(since=...)``: O(appended rows)); findings that cannot be extended
    (the pandas checks ran: odd columns) are checked again from scratch at most at
    ``REBUILD_CPU_SHARE`` of a core per run, so such a snapshot may show an earlier one's findings,
    never more than ``cost / REBUILD_CPU_SHARE`` seconds old.  Diagnostics that fail on odd data
    are themselves a finding, never a page that fails to load."""
    return _once(view, "findings", _carried_findings)


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

    return _carry(view, "findings", update).findings


def _diagnose(view: RunView, since: list[Finding] | None) -> list[Finding]:
    try:
        return diagnose(
            train=view.frame("train", CHECKED_FIELDS),
            sessions=view.sessions,
            redone=view.redone_by,
            ingest=view.ingest,
            since=since,
        )
    except Exception as exc:
        _log.warning("diagnostics of run %r failed", view.name, exc_info=True)
        return [Finding("error", "diagnostics", f"the checks could not run on this data: {type(exc).__name__}: {exc}")]
