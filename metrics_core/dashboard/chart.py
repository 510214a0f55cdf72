"""A live plotly chart for Streamlit that keeps the user's zoom across data updates and sends
only the new points of a live run.

``st.plotly_chart`` remounts the chart whenever its data changes, which throws away zoom and
pan every second on a live run.  This is a ``st.components.v2`` component instead: it renders
into the page DOM (no iframe, so the graph is a ``.js-plotly-plot`` element whose ``data`` and
``layout`` automated checks can read) and redraws with ``Plotly.react``, which keeps the view while
``layout.uirevision`` is unchanged.

Transport (issue 10: every update used to resend every chart's whole figure, ~150 KB a second
for one tab on a 1k-record run).  Per browser session and chart key, ``live_chart`` remembers
what it last sent: the figure's "head" (layout and every trace's non-array properties, hashed)
and each trace's per-point arrays (``x``, ``y``, ``customdata``).  When the head is unchanged
and every new array starts with what was sent, the payload is only the appended points, applied
in the page with ``Plotly.extendTraces`` (plus the layout when it changed: a y-range fitted to
the data, a note counting points off-scale; a few KB, drawn with ``Plotly.react`` on the data
already in the page); anything else (a new session trace, a moved
downsampling bucket, new options) sends the whole figure.  Payloads carry a sequence number and
the one they extend: the page applies each once, and a page that does not hold the base (it
missed an update, or the chart was remounted) says which one it holds with a trigger value, which
reruns the fragment; the answer extends that state if it is one of the last ``HISTORY`` sent,
else it is the whole figure.  A draw that fails in the page (plotly.js throws) is said in the chart's
place, as text, never a chart silently frozen on old data: a failed extend asks for the whole figure
the same way, a whole figure that failed waits for the next one.
Cost per update: O(points drawn) to compare prefixes, bytes O(new points).

plotly.js (issue 11) is plotly's own "basic" bundle of the version the ``plotly`` Python package
ships, vendored in ``vendor/`` (no network; see its README): every chart here is a ``scatter``
trace, and the basic bundle (scatter, bar, pie) is 1.2 MB (396 KB gzipped) where the full one is
4.8 MB (1.5 MB gzipped), whose parsing and running was the largest single cost of a first chart.
It used to ride inside a component element, so every page load (a new session) sent it again
through the websocket.  Now it is a file the browser keeps: at startup it is copied
into ``assets/`` under a name carrying its content hash, and ``pyproject.toml`` declares
``assets/`` as the ``asset_dir`` of the components-v2 component ``metrics-core.plotly``, which
Streamlit serves at ``/_stcore/bidi-components/metrics-core.plotly/<file>``.  Served by app.py, the
file is answered immutable and every page's HTML can run it as a plain ``<script src>``, a chart
page's as soon as Streamlit's page is up (``plotly_head_tags``: the browser keeps its compiled code
too).  Streamlit alone sends those files with ``Cache-Control: public`` and nothing else (no
max-age, ETag or Last-Modified), so a plain ``<script src>`` would be fetched whole on every page
load; there the loader fetches it with ``cache: "force-cache"`` (any stored copy, however old:
safe, since the name is the content hash) and runs it from a blob URL.  Streamlit finds the
asset_dir by reading ``pyproject.toml`` next to the package, i.e. in an editable install (``pip
install -e .``, as CI does); elsewhere the route does not exist and plotly.js rides in the loader
element as before, once per page load.
A small loader component mounted once per page carries the chart runtime (``chart.js``, ~6 KB)
and the URL; chart updates carry only the figure or the new points.

The run page's first chart (issue 11, a fresh browser): Streamlit's page has made the live chart's
element ~0.3 s before its lazily loaded component has drawn anything there.  Served by app.py, the
run page's HTML asks the server for that chart's figure as it is parsed (``first_chart_tags``,
``FIRST_CHART_ROUTE``, ``charts.first_chart``: the page's controls as they start, the page's
theme) ahead of Streamlit's scripts, draws it hidden as soon as it has it and plotly.js, and shows
it, a static picture, over the live chart's element as soon as Streamlit has made it, until the
live chart has drawn there (``assets/first_chart.js``).  The server builds the figure
with the page's own memoised ``view_charts``, so the page view that follows finds it made.
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache, cached_property, partial
from pathlib import Path
from typing import Any

import numpy as np
import streamlit as st
from streamlit.components.v2.get_bidi_component_manager import get_bidi_component_manager

from metrics_core.dashboard.figures import THEMES, Figure, figure_json, json_text
from metrics_core.dashboard.serving import after_first_run, base_path, when_in_page

_ASSETS = Path(__file__).parent / "assets"
_VENDOR = Path(__file__).parent / "vendor"
# Declared in pyproject.toml ([[tool.streamlit.component.components]]): "<project>.<component>".
PLOTLY_COMPONENT = "metrics-core.plotly"
_ASSET_ROUTE = f"/_stcore/bidi-components/{PLOTLY_COMPONENT}/"  # where Streamlit serves its asset_dir
LOADER_KEY = "metrics_plotly_loader"  # the element that loads plotly.js; draws nothing (widgets.CALM_CSS hides it)
_LOG = logging.getLogger(__name__)
POINT_ARRAYS = ("x", "y", "customdata")  # per-point trace properties that extendTraces appends to
_SENT = "_metrics_live_chart_sent"  # st.session_state key: per browser session, chart key -> _Sent
_RESYNC = "_metrics_live_chart_resync"  # chart key -> the seq its page holds (None: nothing), having missed one
HISTORY = 4  # payload states kept per chart and session, for a page that missed the newest ones
_ZOOM = "_metrics_live_chart_zoom"  # chart key -> the x-range the user zoomed to, or None


# Every element carries its component's JS on every rerun (BidiComponent.js_content), so the
# chart's runtime rides in the loader, sent once per session, and each chart
# element carries only this stub (~200 bytes instead of ~4 KB per chart per refresh); a chart
# that comes before the runtime waits in a queue the runtime draws as it starts.
_STUB = """export default function (component) {
  if (window.__metricsChart) window.__metricsChart(component);
  else (window.__metricsChartQueue = window.__metricsChartQueue || []).push(component);
}"""


def plotly_source() -> Path:
    """The vendored plotly.js basic bundle (scatter, bar and pie traces only)."""
    return _VENDOR / "plotly-basic.min.js"


def publish_plotly(assets: Path) -> str:
    """Copy plotly.js into ``assets`` as ``plotly-<sha256 prefix>.min.js`` (once per plotly version) and
    return that name.  The hash in the name is what lets the page use a cached copy without asking.
    Written to a temporary file and renamed: a concurrent server or request never sees half a file."""
    data = plotly_source().read_bytes()
    name = f"plotly-{hashlib.sha256(data).hexdigest()[:16]}.min.js"
    target = assets / name
    if not target.is_file() or target.stat().st_size != len(data):
        partial_copy = assets / f".{name}.{os.getpid()}.tmp"
        partial_copy.write_bytes(data)
        os.replace(partial_copy, target)
    return name


@cache
def _plotly_url() -> str | None:
    """The URL of the cacheable plotly.js, or None when Streamlit does not serve ``assets/`` (the package
    is not an editable install, so Streamlit never read its pyproject.toml)."""
    root = get_bidi_component_manager().get_component_path(PLOTLY_COMPONENT)
    if root is None or Path(root).resolve() != _ASSETS.resolve():
        _LOG.warning("%s has no asset_dir here: plotly.js is sent inline with every page load", PLOTLY_COMPONENT)
        return None
    prefix = base_path(str(st.get_option("server.baseUrlPath") or ""))
    return f"{prefix}{_ASSET_ROUTE}{publish_plotly(_ASSETS)}"


# Route path prefix of the published plotly.js: its name carries its content hash (publish_plotly).
PLOTLY_ASSETS = f"{_ASSET_ROUTE}plotly-"


def plotly_file() -> tuple[str, Path] | None:
    """The published plotly.js as (route path without the base URL, file), for the server to compress
    ahead of its first request; None where Streamlit does not serve it as a file."""
    url = _plotly_url()
    if url is None:
        return None
    name = url.rpartition("/")[2]
    return f"{_ASSET_ROUTE}{name}", _ASSETS / name


# For every page's head (app.py, served): ``window.__metricsRunPlotly`` runs plotly.js once per page
# from its URL, answered immutable, so the browser keeps the file and its compiled code; the
# loader's runtime (chart.js) calls it when a chart page is reached without a reload, from the runs
# page, and takes the promise over.
_PLOTLY_RUNNER = """(() => {
  const src = PLOTLY_URL;
  window.__metricsRunPlotly = () => {
    window.__metricsPlotly = window.__metricsPlotly || new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = src;
      script.onload = () => resolve(window.Plotly);
      script.onerror = () => reject(new Error(`${src}: not run`));
      document.head.appendChild(script);
    });
  };
})();"""


def plotly_head_tags(*, chart_page: bool) -> str:
    """Tags for a page's ``<head>``: ``window.__metricsRunPlotly`` (``_PLOTLY_RUNNER``); on a chart
    page a preload of plotly.js and its run as soon as Streamlit's React root is up, on another its
    run once the page is drawn and idle (``serving.after_first_run``: a click from the runs page to
    a run then finds plotly.js compiled and running); "" where
    Streamlit does not serve plotly.js as a file (then it rides in the loader element).  A plain
    ``<script src>`` of the content-hashed URL, not a blob, so that the browser keeps plotly.js's
    compiled code: on a repeat load it then costs ~0 ms instead of an ~80 ms task, and on a chart
    page it has run before the first chart's element arrives (measured: first chart in a warm
    browser ~600 → ~420 ms; docs/PERFORMANCE.md, fourth round).  The server must answer the file
    as immutable (``serving.StaticGzip(hashed=[PLOTLY_ASSETS])``), else every page load downloads
    it again: the runner's presence is what tells chart.js so."""
    url = _plotly_url()
    if url is None:
        return ""
    runner = _PLOTLY_RUNNER.replace("PLOTLY_URL", json.dumps(url).replace("</", "<\\/"))
    if not chart_page:  # the reader's next page usually has charts: run it once this one is drawn
        return f"<script>{runner}</script>" + after_first_run("window.__metricsRunPlotly();")
    # On a chart page, as soon as Streamlit's React root is in the page, while Streamlit waits for its
    # websocket and first script run.
    early = when_in_page("[data-testid=stApp]", "window.__metricsRunPlotly")
    return f'<link rel="preload" as="script" href="{html.escape(url)}"><script>{runner}</script>{early}'


# Where the server answers the run page's first chart (app.py), relative to its base URL.
FIRST_CHART_ROUTE = "api/first-chart"
MEASURED_LAYOUT = "1.67."  # the Streamlit whose page layout first_chart.js's guessPlace was measured in


@cache
def first_chart_tags() -> str:
    """For the run page's ``<head>``, after ``plotly_head_tags``, both before Streamlit's scripts:
    ``first_chart.js``, which draws the page's first chart (``charts.first_chart``, answered at
    ``FIRST_CHART_ROUTE``) while Streamlit's page is still starting, shown where the live chart will
    be (before Streamlit has laid out the page) until the live chart has drawn; "" where plotly.js
    is not served as a file.  Made once per process: the options it reads are fixed."""
    if _plotly_url() is None:
        return ""
    imposed = st.get_option("theme.base")  # the page's theme when the reader has chosen none
    # the live chart's place follows from the viewport in the layout first_chart.js was measured
    # against, at Streamlit's default sizes of text
    place = st.__version__.startswith(MEASURED_LAYOUT) and all(
        st.get_option(f"theme.{size}") is None for size in ("baseFontSize", "headingFontSizes")
    )
    config = {"route": FIRST_CHART_ROUTE, "theme": imposed if imposed in THEMES else None, "place": place}
    script = (_ASSETS / "first_chart.js").read_text(encoding="utf-8")
    return "<script>" + script.replace("__FIRST_CHART__", json.dumps(config)) + "</script>"


def first_chart_json(key: str, figure: Figure) -> bytes:
    """What ``FIRST_CHART_ROUTE`` answers: the chart's Streamlit key and its figure, arrays as plain
    lists (the drawn graph's ``data`` then holds numbers, as the live chart's does once chart.js has
    unpacked plotly.py's packing)."""
    return json_text({"key": key, "figure": figure}).encode()


@cache
def _loader(inline_plotly: bool) -> object:
    runtime = (_ASSETS / "chart.js").read_text(encoding="utf-8")
    source = plotly_source().read_text(encoding="utf-8") if inline_plotly else ""
    return st.components.v2.component("metrics_plotly_loader", js=f"{source}\n{runtime}", isolate_styles=False)


@cache
def _chart() -> object:
    return st.components.v2.component("metrics_live_chart", js=_STUB, isolate_styles=False)


def load_plotly() -> None:
    """Mount plotly.js once on this page; call before any ``live_chart``."""
    url = _plotly_url()
    _loader(url is None)(key=LOADER_KEY, data={"src": url}, height="content")


class Encoded:
    """A figure split for diffing: its traces' non-array properties (hashed), its per-point arrays,
    its layout, and its full JSON (built only when a whole figure must be sent)."""

    def __init__(self, figure: Figure, head: str, arrays: tuple[dict[str, np.ndarray], ...], layout: str) -> None:
        self._figure, self.head, self.arrays, self.layout = figure, head, arrays, layout

    @cached_property
    def json(self) -> str:
        return figure_json(self._figure)


@dataclass(frozen=True, slots=True)
class _Sent:
    seq: int
    encoded: Encoded
    payload: dict[str, Any]
    earlier: tuple[tuple[int, Encoded], ...] = ()  # states sent before ``seq``, newest first


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
    return [[_plain(item) for item in row] if isinstance(row, (list, tuple, np.ndarray)) else _plain(row)
            for row in values.tolist()]  # fmt: skip


def _plain(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    return value.item() if isinstance(value, np.generic) else value


def next_payload(previous: _Sent | None, encoded: Encoded, *, resync: bool, held: int | None = None) -> _Sent:
    """What to send for ``encoded`` after ``previous`` (None: nothing sent yet in this session).

    ``resync``: the page missed a payload and holds state ``held`` (None: none it can extend).  A
    page misses payloads when it is busy: Streamlit then renders a component with only the latest
    of several updates.  While ``held`` is one of the last ``HISTORY`` states, the answer extends
    it (a few points) instead of resending the whole figure (~90 KB a chart on a long run).
    """
    if previous is None:
        return _Sent(1, encoded, {"op": "full", "seq": 1, "figure": encoded.json})
    if previous.encoded is encoded and not resync:
        return replace(previous, payload={"op": "same", "seq": previous.seq})  # an idle refresh: a few bytes
    base = held if resync else previous.seq
    old = dict(((previous.seq, previous.encoded), *previous.earlier)).get(base)
    steps = None if old is None else extension(old, encoded)
    if not resync and steps == [] and encoded.layout == previous.encoded.layout:
        return _Sent(previous.seq, encoded, {"op": "same", "seq": previous.seq}, previous.earlier)
    seq, earlier = previous.seq + 1, ((previous.seq, previous.encoded), *previous.earlier[: HISTORY - 2])
    if steps is None:
        return _Sent(seq, encoded, {"op": "full", "seq": seq, "figure": encoded.json}, earlier)
    payload = {"op": "extend", "seq": seq, "base": base, "steps": steps}
    if encoded.layout != old.layout:  # e.g. a y-range fitted to the data: small, sent whole
        payload["layout"] = encoded.layout
    return _Sent(seq, encoded, payload, earlier)


def _ask_again(key: str) -> None:
    """The page could not extend chart ``key`` (it missed a payload, or was remounted): note the
    state it holds, which the next payload extends if it can (else it is the whole figure)."""
    state = st.session_state.get(key)
    asked = state.get("resync") if hasattr(state, "get") else None
    held = asked.get("held") if isinstance(asked, dict) else None
    st.session_state.setdefault(_RESYNC, {})[key] = held if isinstance(held, int) else None


def _note_zoom(key: str) -> None:
    """The user zoomed chart ``key`` (an x-range) or zoomed back out (None)."""
    state = st.session_state.get(key)
    xrange = state.get("xrange") if hasattr(state, "get") else None
    valid = isinstance(xrange, list) and len(xrange) == 2 and all(isinstance(v, (int, float)) for v in xrange)
    st.session_state.setdefault(_ZOOM, {})[key] = tuple(xrange) if valid else None


def live_chart(figure: Figure, *, key: str, zoom: Callable[[tuple[float, float]], Figure | None] | None = None) -> None:
    """Show ``figure``; later calls with the same ``key`` update it in place, sending only new
    points when that is all that changed.

    Zoom to raw points: the page reports the x-range the user zoomed to, and while it stands the
    chart shows ``zoom(xrange)`` (the records in that range at full resolution, e.g.
    ``charts.zoom_chart``) instead of ``figure``; zooming out (autoscale, double-click) returns to
    ``figure``.  The figure keeps its ``uirevision``, so the user's view stays where it is.
    """
    xrange = st.session_state.get(_ZOOM, {}).get(key)
    if xrange is not None and zoom is not None:
        figure = zoom(xrange) or figure
    sent: dict[str, _Sent] = st.session_state.setdefault(_SENT, {})
    asked: dict[str, int | None] = st.session_state.setdefault(_RESYNC, {})
    current = next_payload(sent.get(key), encode(figure), resync=key in asked, held=asked.get(key))
    _chart()(key=key, data=current.payload, height="content", default={"xrange": None},
             on_resync_change=partial(_ask_again, key), on_xrange_change=partial(_note_zoom, key))  # fmt: skip
    # Only now: Streamlit interrupts a rerun (a newer one was asked for) inside an element call,
    # before the element is sent; recording the payload first made the page miss it and ask for
    # the whole figure (~90 KB a chart on a long run, several times a minute under load).
    sent[key] = current
    asked.pop(key, None)
