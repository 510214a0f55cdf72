"""A live plotly chart for Streamlit that keeps the user's zoom across data updates and sends
only the new points of a live run.

``live_chart(figure, key=...)`` is a ``st.components.v2`` component rendered into the page DOM (no
iframe: the graph is a ``.js-plotly-plot`` element whose ``data`` and ``layout`` automated checks
can read), redrawn with ``Plotly.react``, which keeps the view while ``layout.uirevision`` is
unchanged.  ``st.plotly_chart`` would remount the chart whenever its data changes, losing the
user's zoom on every refresh of a live run.

Transport.  Per browser session and chart key, the last payloads sent are remembered: the
figure's "head" (layout and every trace's non-array properties, hashed) and each trace's
per-point arrays (``POINT_ARRAYS``).  When the head is unchanged and every new array starts with
what was sent, the payload is only the appended points (``Plotly.extendTraces`` in the page, plus
the layout when it changed); an idle refresh sends "same"; anything else (a new session trace, a
moved downsampling bucket, new options) sends the whole figure.  A payload names the figure it
draws and the one it extends by ``Encoded.token``, a number per figure in this server process: the
page applies each once, and a page that does not hold the base says which one it holds, which
reruns the fragment; the answer extends that figure while it is kept, else it is the whole figure.
The same payloads reach a page without a rerun, from the server's route (``feed``), and the
page then says what it holds at its next rerun (``pages_hold``).  A draw that fails in the page is said in the
chart's place as text, never a chart silently frozen on old data.  Cost per update: O(points
drawn) to compare prefixes, bytes O(new points).

plotly.js is plotly's own "basic" bundle (scatter, bar, pie) of the version the ``plotly`` Python
package ships, vendored in ``vendor/`` (no network at run time; see its README).  ``load_plotly``
mounts a loader element once per page that carries the chart runtime (``assets/live_chart.js``)
and the URL of plotly.js; each chart element carries only a stub and its payload.  plotly.js is a
file the browser keeps: the package's component manifest, ``metrics_core/pyproject.toml`` (package
data, so in a checkout and in an installed wheel alike), declares ``vendor/`` as the ``asset_dir`` of
the components-v2 component ``PLOTLY_COMPONENT``, which Streamlit serves as files; where, and
whether it does for this copy of the package, only Streamlit's internals say, so the page is given
that URL (``server.page_head.plotly_url``, behind the fence).  Nothing is written into the package
at run time: an install the server cannot write to serves the same.  Without a URL, plotly.js rides
inline in the loader element, once per page load.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, cached_property, partial
from pathlib import Path
from typing import Any

import numpy as np
import streamlit as st

from metrics_core.dashboard.figures.figure_dicts import Figure, figure_json, json_text

_ASSETS = Path(__file__).parent.parent / "assets"
_VENDOR = Path(__file__).parent.parent / "vendor"
# Declared in metrics_core/pyproject.toml ([[tool.streamlit.component.components]]): "<project>.<component>".
PLOTLY_COMPONENT = "metrics-core.plotly"
LOADER_KEY = "metrics_plotly_loader"  # the element that loads plotly.js; draws nothing (widgets.CALM_CSS hides it)
POINT_ARRAYS = ("x", "y", "customdata")  # per-point trace properties that extendTraces appends to
_SENT = "_metrics_live_chart_sent"  # st.session_state key: per browser session, chart key -> _Sent
_RESYNC = "_metrics_live_chart_resync"  # chart key -> the figure its page holds (None: none kept), having missed one
HISTORY = 4  # payload states kept per chart and session, for a page that missed the newest ones
_ZOOM = "_metrics_live_chart_zoom"  # chart key -> the x-range the user zoomed to, or None


# Every element carries its component's JS on every rerun, so the chart's runtime rides in the
# loader, sent once per session, and each chart element carries only this stub; a chart that
# comes before the runtime waits in a queue the runtime draws as it starts.
_STUB = """export default function (component) {
  if (window.__metricsChart) window.__metricsChart(component);
  else (window.__metricsChartQueue = window.__metricsChartQueue || []).push(component);
}"""


def plotly_source() -> Path:
    """The vendored plotly.js basic bundle (scatter, bar and pie traces only)."""
    return _VENDOR / "plotly-basic.min.js"


@cache
def _loader(inline_plotly: bool) -> object:
    runtime = (_ASSETS / "live_chart.js").read_text(encoding="utf-8")
    source = plotly_source().read_text(encoding="utf-8") if inline_plotly else ""
    return st.components.v2.component("metrics_plotly_loader", js=f"{source}\n{runtime}", isolate_styles=False)


@cache
def _chart() -> object:
    return st.components.v2.component("metrics_live_chart", js=_STUB, isolate_styles=False)


def load_plotly(url: str | None) -> None:
    """Mount plotly.js once on this page, from ``url`` (``server.page_head.plotly_url``; None: sent
    inline); call before any ``live_chart``."""
    _loader(url is None)(key=LOADER_KEY, data={"src": url}, height="content")


class Encoded:
    """A figure split for diffing: its traces' non-array properties (hashed), its per-point arrays,
    its layout, and its full JSON (built only when a whole figure must be sent).

    Shared by every tab (``encode``), so what a payload needs of it is computed once for all of
    them: the JSON, and the appended points from each earlier figure a tab holds (``steps_from``).
    """

    def __init__(self, figure: Figure, head: str, arrays: tuple[dict[str, np.ndarray], ...], layout: str) -> None:
        # The figure's parts, not the figure: it keeps its ``Encoded`` (``encode``), and a cycle is
        # freed only by the cyclic collector, whose full passes a server's large heap makes rare, so
        # every figure a live run superseded (points, JSON and all) would wait minutes for one.
        self._parts, self.head, self.arrays, self.layout = dict(figure), head, arrays, layout
        self._lock = threading.Lock()
        with _token_lock:
            self.token = next(_tokens)  # what a page holds once it drew this figure
            _by_token[self.token] = self
        # Weak keys: a figure no tab holds any more is forgotten with its steps.
        self._steps: weakref.WeakKeyDictionary[Encoded, list[dict[str, Any]] | None] = weakref.WeakKeyDictionary()

    @cached_property
    def json(self) -> str:
        return figure_json(self._parts)

    def steps_from(self, old: Encoded) -> list[dict[str, Any]] | None:
        """``extension(old, self)``, once per ``old``: twenty tabs that drew ``old`` pay one O(points)
        prefix comparison and one conversion of the new points between them, not one each.
        Callers must not change the list (it is every tab's)."""
        with self._lock:
            if old in self._steps:
                return self._steps[old]
        steps = extension(old, self)  # outside the lock: a race computes twice, harmlessly
        with self._lock:
            return self._steps.setdefault(old, steps)


_tokens = itertools.count(1)
_token_lock = threading.Lock()
_by_token: weakref.WeakValueDictionary[int, Encoded] = weakref.WeakValueDictionary()


def encoded_by_token(token: object) -> Encoded | None:
    """The figure a page says it holds (``Encoded.token``), while any tab or memo still keeps it."""
    return _by_token.get(token) if isinstance(token, int) else None


@dataclass(frozen=True, slots=True)
class _Sent:
    """What this session last showed of one chart (the page holds ``shown`` once it applied
    ``payload``), and the figures shown before that ``shown`` extends, newest first, for a page that
    missed the newest."""

    shown: Encoded
    payload: dict[str, Any]
    earlier: tuple[Encoded, ...] = ()


def encode(figure: Figure) -> Encoded:
    """``figure`` as ``Encoded``: O(points), once per figure object (figures are memoised per
    snapshot and shared by every tab, so a refresh with nothing new encodes nothing)."""
    cached = getattr(figure, "_metrics_encoded", None)
    if cached is None:
        cached = figure._metrics_encoded = _encode(figure)  # a race encodes twice, harmlessly
    return cached


def _encode(figure: Figure) -> Encoded:
    # The figure's own dicts, read, never copied: the arrays are the figure's (never changed).
    arrays, heads = [], []
    for trace in figure["data"]:
        points = {name: _array(trace[name]) for name in POINT_ARRAYS if _is_array(trace.get(name))}
        arrays.append(points)
        heads.append({name: value for name, value in trace.items() if name not in points})
    head = hashlib.sha1(json_text(heads, sort_keys=True).encode()).hexdigest()
    return Encoded(figure, head, tuple(arrays), json_text(figure["layout"]))


def _is_array(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray)) and np.ndim(value) >= 1


def _array(values: Any) -> np.ndarray:
    return values if isinstance(values, np.ndarray) else np.asarray(values, dtype=object)


def extension(old: Encoded, new: Encoded) -> list[dict[str, Any]] | None:
    """The ``Plotly.extendTraces`` calls that turn the drawn ``old`` into ``new``, or None when
    ``new`` is not ``old`` plus appended points.  ``[]``: nothing new."""
    if old.head != new.head or len(old.arrays) != len(new.arrays):
        return None
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for index, (before, after) in enumerate(zip(old.arrays, new.arrays, strict=True)):
        if before.keys() != after.keys():
            return None
        lengths = {len(values) for values in after.values()}
        if len(lengths) > 1:
            return None
        for name, values in after.items():
            kept = before[name]
            if len(values) < len(kept) or not _same(values[: len(kept)], kept):
                return None
        grown = {name: values[len(before[name]) :] for name, values in after.items()}
        if not grown or not len(next(iter(grown.values()))):
            continue
        group = groups.setdefault(tuple(sorted(grown)), {"indices": [], "update": {name: [] for name in sorted(grown)}})
        group["indices"].append(index)
        for name, values in grown.items():
            group["update"][name].append(_json_list(values))
    return list(groups.values())


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind in "fc" and b.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":  # steps in customdata: no per-item Python loop
        return bool(np.array_equal(a, b))
    pairs = zip(a.tolist(), b.tolist(), strict=True)
    return a.shape == b.shape and all(x == y or (x != x and y != y) for x, y in pairs)


def _json_list(values: np.ndarray) -> list[Any]:
    if values.dtype.kind == "f":
        return [None if v != v else v for v in values.astype(np.float64).tolist()]
    if values.dtype.kind in "iub":
        return values.tolist()
    return [
        [_plain(item) for item in row] if isinstance(row, (list, tuple, np.ndarray)) else _plain(row)
        for row in values.tolist()
    ]


def _plain(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    return value.item() if isinstance(value, np.generic) else value


def held_encodings(held: Mapping[str, object]) -> dict[str, Encoded | None]:
    """``encoded_by_token`` of each token a page says its charts hold, by chart: taken before the
    figures of a new snapshot are built, so none of those still held is dropped meanwhile."""
    return {key: encoded_by_token(token) for key, token in held.items()}


def payloads(figures: Mapping[str, Figure], held: Mapping[str, Encoded | None]) -> dict[str, dict[str, Any]]:
    """The ``chart_payload`` that brings each chart of ``held`` (``held_encodings``) to its figure
    in ``figures``, but those that say "same": a live answer's charts, in one call."""
    found = {key: chart_payload(encode(figures[key]), base) for key, base in held.items()}
    return {key: payload for key, payload in found.items() if payload["op"] != "same"}


def chart_payload(encoded: Encoded, held: Encoded | None) -> dict[str, Any]:
    """The payload that brings a page holding ``held`` (None: nothing it can extend) to ``encoded``:
    ``same`` (naming what it holds) when ``encoded`` adds nothing, the appended points with the
    layout when it changed, or the whole figure.  Every payload names figures by ``Encoded.token``,
    so one sent by a rerun and one fetched from the server's route (``feed``) mean the same."""
    if held is None:
        return {"op": "full", "seq": encoded.token, "figure": encoded.json}
    steps = [] if held is encoded else encoded.steps_from(held)
    if steps == [] and encoded.layout == held.layout:
        return {"op": "same", "seq": held.token}
    if steps is None:
        return {"op": "full", "seq": encoded.token, "figure": encoded.json}
    payload = {"op": "extend", "seq": encoded.token, "base": held.token, "steps": steps}
    if encoded.layout != held.layout:  # e.g. a y-range fitted to the data: small, sent whole
        payload["layout"] = encoded.layout
    return payload


def next_payload(previous: _Sent | None, encoded: Encoded, *, resync: bool, held: Encoded | None = None) -> _Sent:
    """What to send for ``encoded`` after ``previous`` (None: nothing sent yet in this session).

    ``resync``: the page does not hold what this session last sent; it holds figure ``held`` (None:
    none still kept).  A page misses payloads when it is busy (Streamlit then renders a component
    with only the latest of several updates), and moves ahead of this session when it applies the
    route's payloads (``feed``).  The answer extends ``held`` instead of resending the whole figure.
    """
    base = held if resync else None if previous is None else previous.shown
    payload = chart_payload(encoded, base)
    shown = base if payload["op"] == "same" else encoded
    kept = () if previous is None else (previous.shown, *previous.earlier)
    # Points are appended, never changed: only a figure ``shown`` extends can be extended to a later
    # one; a page holding any other gets the whole figure whatever is kept.  Past ``CHART_POINTS``
    # each downsampled figure replaces the one before, so a long run's chart keeps one, not HISTORY.
    earlier = tuple(old for old in kept if old is not shown and shown.steps_from(old) is not None)
    return _Sent(shown, payload, earlier[: HISTORY - 1])


def pages_hold(held: dict[str, object]) -> None:
    """The page says which figure each chart holds (element key -> ``Encoded.token``): it applied
    the route's payloads since this session last drew it, so this rerun extends those.  Call it
    before this run builds its charts: a figure of the previous snapshot is kept until then."""
    asked = st.session_state.setdefault(_RESYNC, {})
    for key, token in held.items():
        asked[key] = encoded_by_token(token)


def _ask_again(key: str) -> None:
    """The page could not extend chart ``key`` (it missed a payload, or was remounted): note the
    state it holds, which the next payload extends if it can (else it is the whole figure)."""
    state = st.session_state.get(key)
    asked = state.get("resync") if hasattr(state, "get") else None
    held = asked.get("held") if isinstance(asked, dict) else None
    st.session_state.setdefault(_RESYNC, {})[key] = encoded_by_token(held)


def _note_zoom(key: str) -> None:
    """The user zoomed chart ``key`` (an x-range) or zoomed back out (None)."""
    state = st.session_state.get(key)
    xrange = state.get("xrange") if hasattr(state, "get") else None
    valid = isinstance(xrange, list) and len(xrange) == 2 and all(isinstance(v, (int, float)) for v in xrange)
    st.session_state.setdefault(_ZOOM, {})[key] = tuple(xrange) if valid else None


def chart_zooms() -> dict[str, tuple[float, float] | None]:
    """The x-range the user zoomed each chart of this browser session to, by key (None: zoomed back
    out); a chart never zoomed is absent.  For a page that acts on a zoom itself (the sweep page
    narrows its runs to a range chosen on one key's chart)."""
    return dict(st.session_state.get(_ZOOM, {}))


def live_chart(
    figure: Figure,
    *,
    key: str,
    zoom: Callable[[tuple[float, float]], Figure | None] | None = None,
    csv: str | None = None,
) -> None:
    """Show ``figure``; later calls with the same ``key`` update it in place, sending only new
    points when that is all that changed.

    Zoom to raw points: the page reports the x-range the user zoomed to, and while it stands the
    chart shows ``zoom(xrange)`` (the records in that range at full resolution, e.g.
    ``chart_memo.zoom_chart``) instead of ``figure``; zooming out (autoscale, double-click) returns to
    ``figure``.  The figure keeps its ``uirevision``, so the user's view stays where it is.
    ``csv``: a URL of the chart's rows as CSV, a link under the chart (``downloads.csv_link``).
    """
    xrange = st.session_state.get(_ZOOM, {}).get(key)
    if xrange is not None and zoom is not None:
        figure = zoom(xrange) or figure
    sent: dict[str, _Sent] = st.session_state.setdefault(_SENT, {})
    asked: dict[str, Encoded | None] = st.session_state.setdefault(_RESYNC, {})
    current = next_payload(sent.get(key), encode(figure), resync=key in asked, held=asked.get(key))
    data = {**current.payload, "key": key} if csv is None else {**current.payload, "key": key, "csv": csv}
    _chart()(
        key=key,
        data=data,
        height="content",
        default={"xrange": None},
        on_resync_change=partial(_ask_again, key),
        on_xrange_change=partial(_note_zoom, key),
    )
    # Only now: Streamlit interrupts a rerun (a newer one was asked for) inside an element call,
    # before the element is sent; a payload recorded before the call would be one the page never
    # got, and it would have to ask for the whole figure.
    sent[key] = current
    asked.pop(key, None)
