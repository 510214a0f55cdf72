"""The run page's first chart drawn by the page's HTML while Streamlit mounts the live one (issue 11,
cold first chart): the server's first-chart route answers the figure the live chart draws first, and
in Chromium that figure appears in the live chart's place before it, stays there, and is gone once
the live chart has drawn."""

from __future__ import annotations

import gzip
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from metrics_core.dashboard.charts import RUN_PAGE_OPTIONS, chart_key
from metrics_core.dashboard.figures import THEMES
from tests.live_server import dashboard, wait_until
from tests.support import append_bytes, append_records, base_record, eight_sessions

BUSY = "a-run-whose-name-is-far-too-long-for-one-line-" * 3  # eight sessions, a config changed, findings


def served_runs(root: Path) -> None:
    """``served_root`` (conftest) for this module: ``small`` with validation records, a long-named run of
    eight sessions with configs and bad lines, and a symlink loop."""
    records = [base_record(s, train_loss=5.0 / s) for s in range(10, 501, 10)]
    records += [base_record(s, event="validation", val_loss=5.5 / s) for s in range(100, 501, 100)]
    append_records(root / "small" / "metrics.jsonl", *records)
    busy = root / BUSY / "metrics.jsonl"
    eight_sessions(busy)
    configs = [base_record(20 * index, event="config", session=f"s{index}", config={"lr": lr, "seed": index})
               for index, lr in enumerate((3e-4, 1e-4))]  # fmt: skip
    append_records(busy, *configs)
    append_bytes(busy, b'{"not": "a record"}\nnot json either\n')
    (root / "loop").symlink_to("loop")


def first_chart(server: str, **query: str) -> tuple[int, dict[str, str], bytes]:
    """The first-chart route's status, headers (lower-case names) and body, gunzipped, for ``query``."""
    url = f"{server}/api/first-chart?{urllib.parse.urlencode(query)}"
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        headers = {k.lower(): v for k, v in answer.headers.items()}
        body = answer.read()
        return answer.status, headers, gzip.decompress(body) if headers.get("content-encoding") == "gzip" else body


@pytest.mark.parametrize("theme", sorted(THEMES))
def test_the_route_answers_the_run_pages_first_chart_in_the_theme_asked(server: str, theme: str) -> None:
    """The loss chart as the run page starts (its key, its title, smoothed as the page's slider starts,
    coloured for the theme), gzipped and never cached: a live run's next answer differs."""
    status, headers, body = first_chart(server, run="small", theme=theme)
    assert status == 200 and headers["content-encoding"] == "gzip" and headers["cache-control"] == "no-store"
    answer = json.loads(body)
    assert answer["key"] == chart_key("loss") == "chart_loss"
    figure = answer["figure"]
    assert figure["layout"]["title"]["text"] == "Loss"
    assert figure["layout"]["paper_bgcolor"] == THEMES[theme]["paper"]
    names = [trace.get("name", "") for trace in figure["data"]]
    assert RUN_PAGE_OPTIONS.smoothing > 0 and any("smoothed" in name for name in names), names


@pytest.mark.parametrize(
    "query",
    [{"run": "missing", "theme": "light"}, {"run": "../small", "theme": "light"}, {"run": "/etc", "theme": "light"},
     {"run": "small", "theme": "purple"}, {"run": "small"}, {"theme": "light"}, {"run": "<b>x</b>", "theme": "dark"},
     {"run": "loop/x", "theme": "light"}],
    ids=["missing", "escapes-the-root", "absolute", "bad-theme", "no-theme", "no-run", "markup", "symlink-loop"],
)  # fmt: skip
def test_the_route_answers_nothing_for_what_the_page_cannot_show(server: str, query: dict[str, str]) -> None:
    """No content (204, nothing to draw): the run page itself says why, as it always did."""
    status, headers, body = first_chart(server, **query)
    assert (status, body) == (204, b"") and headers["cache-control"] == "no-store"


# The early first chart, once it is shown (drawn first hidden, while Streamlit's page starts), else null.
EARLY_SHOWN = """(() => { const early = document.querySelector(".metrics-first-chart");
  return early && early.querySelector(".main-svg") && getComputedStyle(early).visibility === "visible" ? early : null;
})()"""

# In the page, before its scripts: when the early first chart is shown and the live chart drawn,
# where and how wide the early one is (``box``), against the live chart's element at those moments
# if it is there (``offset``; its picture too: drawn at a guessed width, it must have been drawn
# again if that was wrong), and both figures' traces.
WATCH = r"""
window.__first = {};
// y as float32 (the live chart's typed arrays hold float32 values, the early chart's JSON their
// shortest decimal form: the same numbers); a packed array ({dtype, bdata}) has its values in
// _inputArray (chart.js unpacks them, plotly.js keeps what it is given).
const values = (array) => Array.from((array && array._inputArray) || array || []);
const float32 = (v) => (typeof v === "number" ? Math.fround(v) : v);
const traces = (graph) => graph.data.map((t) => ({ name: t.name, x: values(t.x), y: values(t.y).map(float32) }));
const rect = (element) => { const { left, top, width } = element.getBoundingClientRect(); return [left, top, width]; };
const offset = (early) => {
  const place = document.querySelector(".st-key-chart_loss");
  if (!place) return null;
  const slot = place.getBoundingClientRect();
  const box = early.getBoundingClientRect();
  const picture = +early.querySelector(".main-svg").getAttribute("width");
  return [box.left - slot.left, box.top - slot.top, box.width - slot.width, picture - slot.width];
};
new MutationObserver(() => {
  const seen = window.__first;
  const early = EARLY_SHOWN;
  const live = document.querySelector(".st-key-chart_loss .js-plotly-plot");
  if (early && !seen.early) {
    seen.early = { at: performance.now(), traces: traces(early), paper: early.layout.paper_bgcolor,
                   events: getComputedStyle(early).pointerEvents, offset: offset(early), box: rect(early),
                   overflow: document.documentElement.scrollHeight - innerHeight };
  }
  if (live && live.querySelector(".main-svg") && !seen.live) {
    seen.live = { at: performance.now(), traces: traces(live), paper: live.layout.paper_bgcolor,
                  offset: early && offset(early), box: early && rect(early) };
  }
}).observe(document, { subtree: true, childList: true, attributes: true, attributeFilter: ["style"] });
""".replace("EARLY_SHOWN", EARLY_SHOWN)


DESKTOP = {"width": 1400, "height": 1100}


def watch_first_load(
    browser: object, url: str, scheme: str = "light", chosen: str | None = None, init: str = ""
) -> dict:
    """What ``WATCH`` saw on a cold load of ``url`` in a browser whose system theme is ``scheme``
    (and whose reader chose the theme ``chosen`` in Streamlit's settings menu; ``init``: a script
    run first in the page), once the live chart has drawn and the early one is gone."""
    context = browser.new_context(viewport=DESKTOP, color_scheme=scheme)
    try:
        if chosen:  # where Streamlit keeps the choice, per page path
            path = urllib.parse.urlsplit(url).path
            context.add_init_script(
                f"localStorage.setItem('stActiveTheme-{path}-v2', {json.dumps(json.dumps(chosen))})"
            )
        if init:
            context.add_init_script(init)
        context.add_init_script(WATCH)
        page = context.new_page()
        page.goto(url)
        wait_until(page, lambda: page.evaluate("!!window.__first.live"), timeout=60)
        wait_until(page, lambda: page.evaluate("!document.querySelector('.metrics-first-chart')"), timeout=10)
        return page.evaluate("window.__first")
    finally:
        context.close()


def assert_drawn_first_in_place(seen: dict, theme: str, *, pinned: bool = True) -> None:
    """The early chart was shown before the live one drew, the same traces in the same theme, in
    the live chart's place and at its width when the live chart drew.  ``pinned``: it was shown
    there from the start and did not move (else: shown where the live chart's element then was)."""
    early, live = seen.get("early"), seen["live"]
    assert early is not None and early["at"] < live["at"], seen
    assert early["traces"] == live["traces"] and early["paper"] == live["paper"] == THEMES[theme]["paper"]
    assert early["events"] == "none"
    assert early["overflow"] <= 0  # the page itself does not scroll: Streamlit's main block does
    assert live["offset"] is not None and all(abs(delta) <= 1 for delta in live["offset"]), seen
    if pinned:
        assert all(abs(now - then) <= 1 for now, then in zip(live["box"], early["box"], strict=True)), seen
    else:
        assert early["offset"] is not None and all(abs(delta) <= 1 for delta in early["offset"]), seen


THEME_CASES = [("light", None, "light"), ("dark", None, "dark"), ("light", "Dark", "dark"), ("dark", "Light", "light")]


@pytest.mark.parametrize(("scheme", "chosen", "theme"), THEME_CASES)
def test_a_run_page_draws_its_first_chart_in_the_live_charts_place_before_it(
    server: str, browser: object, scheme: str, chosen: str | None, theme: str
) -> None:
    """Opened cold, the run page draws the loss chart from its HTML first: the same traces the live
    chart then draws, in the theme the page takes (the reader's choice, else the system's), over
    the live chart's element (same place and width when the live one has drawn), letting clicks
    through, and gone after."""
    seen = watch_first_load(browser, f"{server}/run?run=small", scheme, chosen)
    assert_drawn_first_in_place(seen, theme)


def test_under_a_base_url_path_and_the_servers_theme_the_early_chart_is_the_live_ones_first(
    served_root: Path, browser: object
) -> None:
    """Served under ``/metrics`` with ``--theme.base dark``, in a light system: the page finds the
    route there, and the early chart and the live chart's first draw are both dark (the live one
    used to be drawn light first, then dark a refresh later)."""
    with dashboard(served_root, "--server.baseUrlPath", "metrics", "--theme.base", "dark") as (url, _, _):
        assert url.endswith("/metrics") and first_chart(url, run="small", theme="dark")[0] == 200
        assert_drawn_first_in_place(watch_first_load(browser, f"{url}/run?run=small", "light"), "dark")


@pytest.mark.parametrize(
    ("query", "theme"), [("run=missing&run=small", "light"), ("run=small&embed_options=dark_theme", "dark")]
)
def test_the_early_chart_reads_the_url_as_streamlit_does(server: str, browser: object, query: str, theme: str) -> None:
    """A repeated ``run`` is the last one (st.query_params' reading), and ``embed_options`` set the
    theme, for the early chart as for the page."""
    assert_drawn_first_in_place(watch_first_load(browser, f"{server}/run?{query}", "light"), theme)


def test_no_early_chart_where_the_page_shows_no_chart(server: str, page: object) -> None:
    """A run that does not exist: the page says so and nothing is drawn over it, at any time."""
    page.add_init_script("""new MutationObserver(() => {
        if (document.querySelector('.metrics-first-chart')) window.__early = true;
    }).observe(document, { subtree: true, childList: true });""")
    page.goto(f"{server}/run?run=missing")
    wait_until(page, lambda: page.evaluate("!!document.querySelector('[data-testid=stAlert]')"), timeout=60)
    page.wait_for_timeout(500)
    assert not page.evaluate("!!window.__early")


@pytest.mark.parametrize("width", [390, 700, 768, 800, 1400])
def test_the_early_chart_is_shown_in_its_place_before_streamlit_lays_out_the_page(
    server: str, browser: object, width: int
) -> None:
    """Whatever the run puts above its charts (a name too long for a line, eight sessions, a config
    changed at resume, findings), at phone, tablet and desktop widths with and without the sidebar:
    the picture is shown where the live chart will be while Streamlit's page does not exist yet
    (its health check held until then), and stays there.  On a phone, where the live chart's place
    is below the fold, the picture (fixed, in the viewport's coordinates) does not make the document
    taller than the screen, which would give it a scrollbar of its own and shift the page twice."""
    context = browser.new_context(viewport={"width": width, "height": 844})
    try:
        context.add_init_script(WATCH)
        page = context.new_page()
        held: list[object] = []
        released: list[bool] = []
        page.route("**/_stcore/health", lambda route: route.continue_() if released else held.append(route))
        page.goto(f"{server}/run?run={urllib.parse.quote(BUSY)}")
        wait_until(page, lambda: page.evaluate(f"{EARLY_SHOWN} !== null"), timeout=60)
        assert held and not page.evaluate("!!document.querySelector('.st-key-chart_loss')")
        released.append(True)
        for route in held:
            route.continue_()
        wait_until(page, lambda: page.evaluate("!!window.__first.live"), timeout=60)
        seen = page.evaluate("window.__first")
        assert seen["early"]["offset"] is None  # shown before the live chart's element existed
        assert_drawn_first_in_place(seen, "light")
    finally:
        context.close()


def test_where_its_place_cannot_be_known_the_early_chart_waits_for_it(served_root: Path, browser: object) -> None:
    """A server that sets its own text size: the rows above the charts are no longer the heights the
    picture's place is computed from, so it is drawn hidden while Streamlit's page starts, at the
    width the live chart will have as guessed from the viewport (here told wrong: a root element
    reported 1,000 px wider than it is), and shown only once the live chart's place exists, drawn
    again at that place's width first: never shown in the wrong place, stretched or cut."""
    wider = """const native = Object.getOwnPropertyDescriptor(Element.prototype, "clientWidth");
        Object.defineProperty(Element.prototype, "clientWidth", { configurable: true, get() {
          const width = native.get.call(this);
          return this === document.documentElement ? width + 1000 : width;
        } });"""
    with dashboard(served_root, "--theme.baseFontSize", "15") as (url, _, _):
        seen = watch_first_load(browser, f"{url}/run?run=small", init=wider)
    assert_drawn_first_in_place(seen, "light", pinned=False)


@pytest.mark.parametrize(
    ("query", "storage"), [("run=small&embed=true", None), ("run=small", "420")], ids=["embedded", "sidebar-resized"]
)
def test_an_embedded_page_or_a_resized_sidebar_makes_the_early_chart_wait_for_its_place(
    server: str, browser: object, query: str, storage: str | None
) -> None:
    """Embedded (``?embed=true``: no top bar, other padding) or with a sidebar the reader dragged
    wider (Streamlit keeps its width in localStorage), the live chart's place is not the computed
    one: the picture waits for it, and is shown there."""
    init = f"localStorage.setItem('sidebarWidth', {storage!r})" if storage else ""
    assert_drawn_first_in_place(watch_first_load(browser, f"{server}/run?{query}", init=init), "light", pinned=False)


@pytest.mark.parametrize("fails", ["aborted", "never"])
def test_the_early_chart_goes_when_the_live_one_cannot_come(server: str, browser: object, fails: str) -> None:
    """Streamlit's component code does not arrive (held until the early picture is drawn): aborted,
    the chart's place shows Streamlit's error and the picture goes with it; never answered, the
    picture goes at the latest a few seconds after the first script run.  A picture that looks live
    must not stay over a chart that is not."""
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        held: list[object] = []
        aborting: list[bool] = []  # once true, asked again (the import after its preload) fails at once

        def hold(route: object) -> None:
            held.append(route)
            if aborting:
                route.abort()

        page.route("**/static/js/BidiComponent.*.js", hold)
        page.goto(f"{server}/run?run=small")
        wait_until(page, lambda: page.evaluate(f"{EARLY_SHOWN} !== null"), timeout=60)
        if fails == "aborted":
            aborting.append(True)
            for route in list(held):
                route.abort()
            alert = ".st-key-chart_loss [data-testid=stAlertContainer]"
            wait_until(page, lambda: page.evaluate(f"!!document.querySelector({alert!r})"), timeout=30)
        start = time.monotonic()
        wait_until(page, lambda: page.evaluate("!document.querySelector('.metrics-first-chart')"), timeout=15)
        assert fails == "never" or time.monotonic() - start < 2  # with the alert, not at the deadline
        assert held  # the component's code was asked for, and never came
    finally:
        context.close()
