"""What a run page's tab gets when its run changed, without a rerun of its fragment.

A fragment rerun costs every tab a script run and every element of the page built, sent and
compressed again, although an append changes only the charts' points and the counts in the status
line.  So a tab that is told its run changed (``push``) asks for ``feed_answer`` instead: the
new status line and, per chart it holds, the payload that brings it to the new snapshot
(``chart_component.chart_payload``: usually a few appended points).  The answer depends only on the
snapshot, the page's options and what the tab holds, so tabs in step share one answer
(``push`` keeps it), and twenty viewers cost about one.

Everything else the page draws is summed up by ``page_signature``, in two parts.  When its layout
part differs from the one the tab drew (the run stopped, a session began, a finding or an alert
came, a chart was added), the answer is ``{"rerun": true}`` and the tab reruns its fragment as
before.  Its details part covers the findings' messages behind the health button, whose counts
change with every append: the answer carries it, and the tab reruns for it at most every
``DETAILS_S`` seconds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from metrics_core.dashboard.figures.chart_memo import view_chart_groups
from metrics_core.dashboard.figures.figure_dicts import Figure, json_text
from metrics_core.dashboard.live.chart_component import held_encodings, payloads
from metrics_core.dashboard.store.snapshot import RunView
from metrics_core.dashboard.views.chart_specs import ChartOptions, chart_keys
from metrics_core.dashboard.views.memo import PageViews, view_page


def status_line(view: RunView) -> tuple[str, str]:
    """The run page's status line as (status, the counts after it), in bold and plain."""
    counts = (
        f" · {len(view.sessions)} session(s) · {view.records} records · {view.ingest.bad_lines} bad lines"
        f" · {view.ingest.pending_bytes} bytes pending"
    )
    return view.status, counts


DETAILS_S = 30.0  # a tab reruns for changed finding messages at most this often


class PageSignature(NamedTuple):
    """Digests of every input of the run page other than the charts' points and the status line's
    counts: ``layout``, what is in sight (the status and why it stopped, the sessions of the key, the
    config records, which findings there are, the firing alerts, which charts are drawn under which
    headings); ``details``, the findings' messages, behind a button."""

    layout: str
    details: str


class _Page(NamedTuple):
    """What the run page draws of a snapshot, computed down the layers in one pass: the views'
    values (the chart list, the findings), then the figures drawn of that chart list."""

    views: PageViews
    groups: dict[str, dict[str, Figure]]
    logged: int


def _page(view: RunView, options: ChartOptions) -> _Page:
    views = view_page(view)
    return _Page(views, *view_chart_groups(view, options, views.charts))


def page_signature(view: RunView, options: ChartOptions, alerts: Sequence[str]) -> PageSignature:
    """The ``PageSignature`` of the run page drawing ``view`` with ``options`` and firing ``alerts``."""
    return _signature(view, _page(view, options), alerts)


def _signature(view: RunView, page: _Page, alerts: Sequence[str]) -> PageSignature:
    findings = page.views.findings
    layout = (
        view.status,
        view.reason,
        [(session.index, session.resume_step) for session in view.sessions],
        view.rows("config"),
        [(finding.severity, finding.check) for finding in findings],
        list(alerts),
        [(group, list(figures)) for group, figures in page.groups.items()],
        page.logged,
    )
    return PageSignature(_digest(layout), _digest([finding.message for finding in findings]))


def _digest(value: object) -> str:
    return hashlib.sha1(json_text(value).encode()).hexdigest()[:16]


def drawn_charts(view: RunView, options: ChartOptions) -> dict[str, Figure]:
    """The run page's charts of ``view`` by their element keys (``chart_specs.chart_key``)."""
    return _drawn(_page(view, options))


def _drawn(page: _Page) -> dict[str, Figure]:
    figures = {key: figure for keyed in page.groups.values() for key, figure in keyed.items()}
    return dict(zip(chart_keys(figures), figures.values(), strict=True))


def feed_answer(
    view: RunView, options: ChartOptions, alerts: Sequence[str], drawn: str, held: Mapping[str, int]
) -> dict[str, Any]:
    """What brings a tab that drew a page of layout signature ``drawn`` and holds chart figures
    ``held`` (element key -> ``Encoded.token``) to ``view``: the status line, a payload per chart
    whose figure changed and the details signature, or ``{"rerun": True}`` when the layout changed.
    Down the layers once: the snapshot's views, the figures drawn of them, their payloads."""
    # First: the previous snapshot's figures, which tabs in step hold, are kept until new ones are built.
    bases = held_encodings(held)
    page = _page(view, options)
    signature = _signature(view, page, alerts)
    if signature.layout != drawn:
        return {"rerun": True}
    figures = _drawn(page)
    if held.keys() != figures.keys():  # the tab holds other charts than the page draws
        return {"rerun": True}
    status, counts = status_line(view)
    return {"status": status, "counts": counts, "charts": payloads(figures, bases), "details": signature.details}
