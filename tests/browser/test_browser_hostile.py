"""Hostile input in a real headless Chromium against a real `streamlit run`: one server for the module.

Poisoned runs (one per class of line a reader once choked on) must be listed and drawn with the
bad line named; hostile names and session ids must stay visible text (no link, no bold, no image,
no page wider than the window); no URL, good or bad, shows a traceback or a server path.  Entries
of the root that cannot be looked into are named beside the runs; the server runs bound by the
file modes (``without_permission_override``), so what they refuse it is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import orjson
import pytest

from metrics_core.dashboard.views.chart_filter import chart_filter
from metrics_core.testing.live_server import GRAPH_JS, GRID_JS, popover_text, streamlit_server, wait_until
from tests.support import DESKTOP, REPO, append_bytes, append_records, base_record, without_permission_override

NORMAL = ("normal-a", "normal-b", "normal-c")


def good(step: int, **values: object) -> bytes:
    return orjson.dumps(base_record(step, train_loss=1.0 / step, **values)) + b"\n"


_BAD = good(25)  # a valid line, bent into each bad one below
POISONED = {
    "poison-step-2p63": _BAD.replace(b'"step":25', b'"step":9223372036854775808'),
    "poison-tokens-1e400": _BAD.replace(b'"tokens_seen":2500', b'"tokens_seen":1e400'),
    "poison-time-1500": _BAD.replace(b"2026-11-29T10:00:25.000000+00:00", b"1500-01-01T00:00:00+00:00"),
    "poison-time-9999": _BAD.replace(b"2026-11-29T10:00:25.000000+00:00", b"9999-12-31T23:59:59+00:00"),
    "poison-time-0001": _BAD.replace(b"2026-11-29T10:00:25.000000+00:00", b"0001-01-01T00:00:00+14:00"),
    "poison-utf8": _BAD.replace(b'"session_id":"s1"', b'"session_id":"s\xff\xfe1"'),
    "poison-nan": _BAD.replace(b'"train_loss":0.04', b'"train_loss":NaN'),
    "poison-2mb": orjson.dumps(base_record(25, train_loss=0.5, note="x" * (2 << 20))) + b"\n",
}
LOGIN = "[Log in again](https://evil.example/login)"
LONG_ID = "L" * 10_000
EVIL_VALUE = '<a href="https://evil.example">x</a>'
NESTED = "[x](https:/evil.example)"  # the directory "[x](https:" holding "evil.example)"
HOSTILE_RUNS = ("**bold**", "<img src=x onerror=alert(1)>", NESTED)
SESSIONS_RUN = "hostile-sessions"

# Every <a> (HTML or SVG) whose target is on evil.example; <b>/<strong> made from a name; injected images.
DOM_CHECK_JS = """() => {
  const host = (href) => { try { return new URL(href, location.href).hostname; } catch { return ''; } };
  const evil = [...document.querySelectorAll('a')]
    .map(a => a.getAttribute('href') || a.getAttribute('xlink:href') || '')
    .filter(href => host(href).endsWith('evil.example'));
  const bold = [...document.querySelectorAll('strong, b')].map(e => e.textContent)
    .filter(t => /bold|Log in|evil/.test(t));
  const images = document.querySelectorAll('img[src="x"], img[onerror], [onerror]').length;
  const main = document.querySelector('[data-testid="stMain"]');
  return {
    evil, bold, images,
    text: document.body.innerText.replaceAll('\u2060', ''),
    width: window.innerWidth,
    scroll: Math.max(document.documentElement.scrollWidth, document.body.scrollWidth),
    mainOverflow: main ? main.scrollWidth - main.clientWidth : 0,
    exceptions: document.querySelectorAll('[data-testid="stException"]').length,
    alerts: window.__alerts || [],
  };
}"""


def make_root(root: Path) -> None:
    for name in NORMAL:
        append_records(root / name / "metrics.jsonl", *(base_record(s, train_loss=1.0 / s) for s in range(10, 51, 10)))
    for name, line in POISONED.items():
        append_bytes(root / name / "metrics.jsonl", good(10) + good(20) + line + good(30) + good(40))
    for name in HOSTILE_RUNS:
        append_records(root / name / "metrics.jsonl", *(base_record(s, train_loss=1.0 / s) for s in (10, 20, 30)))
    # Two sessions with hostile ids, each with one window whose counters do not add up (a finding
    # that names the session), a replay with a loss jump (a resume warning naming both), a string
    # where a loss belongs, and a session_end whose status is HTML.
    path = root / SESSIONS_RUN / "metrics.jsonl"
    accounting = {"attempted_updates": 2, "updates": 1, "skipped_updates_in_window": 0}
    append_records(path, *(base_record(s, session=LOGIN, train_loss=1.0 / s, note=EVIL_VALUE) for s in (10, 20, 30)))
    append_records(path, base_record(40, session=LOGIN, train_loss=EVIL_VALUE, **accounting),
                   base_record(50, session=LOGIN, train_loss=0.02),
                   base_record(50, event="session_end", session=LOGIN, status=EVIL_VALUE))  # fmt: skip
    append_records(path, *(base_record(s, session=LONG_ID, train_loss=5.0 / s) for s in range(30, 81, 10)))
    append_records(path, base_record(90, session=LONG_ID, train_loss=0.05, **accounting))


# Entries of the root the server cannot look into, each named by the runs page with the reason.
UNREADABLE = {"link-loop": "symlink loop", "link-through-file": "not a directory", "locked-dir": "permission denied"}
LOCKED_FILE = "locked-file"  # a run whose metrics file the server may not read: an error row


def make_bad_entries(root: Path) -> None:
    (root / "link-loop").symlink_to("link-loop")
    (root / "link-through-file").symlink_to(f"{NORMAL[0]}/metrics.jsonl/x")
    append_records(root / "locked-dir" / "inner" / "metrics.jsonl", base_record(10, train_loss=0.1))
    (root / "locked-dir").chmod(0)
    append_records(root / LOCKED_FILE / "metrics.jsonl", base_record(10, train_loss=0.1))
    (root / LOCKED_FILE / "metrics.jsonl").chmod(0)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("hostile_runs")
    make_root(root)
    make_bad_entries(root)
    yield root
    (root / "locked-dir").chmod(0o755)


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[str]:
    with streamlit_server(root, command_prefix=without_permission_override()) as url:
        yield url


@pytest.fixture(scope="module")
def alerts_recorded(browser: object) -> Iterator[object]:
    """The module's browser context: its tabs record what a page passes to ``alert()``."""
    context = browser.new_context(viewport=DESKTOP)
    context.add_init_script("window.__alerts = []; window.alert = (m) => window.__alerts.push(String(m));")
    yield context
    context.close()


@pytest.fixture
def page(alerts_recorded: object) -> Iterator[object]:
    tab = alerts_recorded.new_page()
    tab.on("dialog", lambda dialog: dialog.dismiss())
    yield tab
    tab.close()


def url_of(server: str, page: str, *runs: str) -> str:
    return f"{server}/{page}" + ("?" + "&".join(f"run={quote(run, safe='')}" for run in runs) if runs else "")


def body_text(page: object) -> str:
    """The page's visible text; markdown text carries invisible word joiners that stop autolinks."""
    return page.evaluate("document.body.innerText").replace("\u2060", "")


def assert_nothing_injected(page: object) -> dict:
    """The page's DOM holds no link to evil.example, no bold name, no image, no traceback, and fits the window."""
    dom = page.evaluate(DOM_CHECK_JS)
    assert dom["evil"] == [], dom["evil"]
    assert dom["bold"] == [], dom["bold"]
    assert dom["images"] == 0 and dom["alerts"] == []
    assert dom["exceptions"] == 0 and "Traceback" not in dom["text"] and str(REPO) not in dom["text"]
    assert dom["scroll"] <= dom["width"] + 5, f"page is {dom['scroll']} px wide in a {dom['width']} px window"
    assert dom["mainOverflow"] <= 5
    return dom


def runs_table_rows(page: object, pattern: str, read: int | None = None) -> dict[str, list[str]]:
    """The runs table's rows (by run name) after filtering by ``pattern``, read from the grid's cells;
    with ``read``, once no row's cell in that column is still "—" (the store lists a run at once and
    fills in what needs the whole file, such as its bad lines, as its loader reads it)."""
    box = page.get_by_label("Filter runs", exact=True)
    box.fill(pattern)
    box.press("Enter")
    kept = chart_filter(pattern)

    def rows() -> dict[str, list[str]] | None:
        cells = page.evaluate(
            "() => [...document.querySelectorAll('[data-testid=stDataFrame] tbody tr')]"
            ".map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent))"
        )
        table = {unquote(row[0].removeprefix("run?run=")): row for row in cells if row}
        settled = read is None or all(row[read] != "—" for row in table.values())
        return table if table and settled and all(kept.keeps(name) for name in table) else None

    return wait_until(page, rows, timeout=30)


def loss_steps(page: object) -> list[tuple[float, float]]:
    graph = page.evaluate(GRAPH_JS, "Loss")
    if not graph:
        return []
    raw = [t for t in graph["traces"] if t["name"].startswith("train") and "smoothed" not in t["name"]]
    return sorted((x, y) for t in raw for x, y in zip(t["x"], t["y"], strict=True) if x is not None)


# -- poisoned runs ------------------------------------------------------------------------------


def test_overview_lists_every_run_with_its_bad_line_count(page: object, server: str) -> None:
    """/ lists every normal and poisoned run, none as an error, each poisoned one with 1 bad line."""
    page.goto(f"{server}/")
    headers = "[...document.querySelectorAll('[data-testid=stDataFrame] thead th')].map(h => h.textContent)"
    columns = wait_until(page, lambda: page.evaluate(headers), timeout=30)
    status, bad = columns.index("status"), columns.index("bad lines")
    normal = runs_table_rows(page, "^normal-", read=bad)
    assert sorted(normal) == list(NORMAL)
    assert all(row[bad] == "0" and row[status] != "error" for row in normal.values())
    poisoned = runs_table_rows(page, "^poison-", read=bad)
    assert sorted(poisoned) == sorted(POISONED)
    errors = {name: row[columns.index("error")] for name, row in poisoned.items() if row[status] == "error"}
    assert errors == {}, f"runs the reader could not read: {errors}"
    assert {name: row[bad] for name, row in poisoned.items()} == dict.fromkeys(POISONED, "1")
    assert_nothing_injected(page)


@pytest.mark.parametrize("name", list(POISONED))
def test_poisoned_run_draws_its_valid_records_and_names_the_bad_line(page: object, server: str, name: str) -> None:
    """The run page draws the four valid records around the bad line and names line 3 and why."""
    page.goto(url_of(server, "run", name))
    wait_until(page, lambda: loss_steps(page) or page.get_by_text("Cannot show run").count(), timeout=30)
    assert page.get_by_text("Cannot show run").count() == 0, body_text(page)[:2000]
    points = loss_steps(page)
    assert [x for x, _ in points] == [10, 20, 30, 40]
    assert [y for _, y in points] == pytest.approx([1 / 10, 1 / 20, 1 / 30, 1 / 40], rel=1e-6)
    assert "1 bad lines" in page.locator(".metrics-status").inner_text()
    health = popover_text(page, "Health")
    assert re.search(r"line 3: \S", health), health
    assert_nothing_injected(page)


def test_overview_names_what_it_cannot_read_beside_every_run_and_no_server_path(
    page: object, server: str, root: Path
) -> None:
    """A symlink loop, a link through a file and a directory the server may not list are rows naming
    the entry and why, first; a metrics file it may not read is an error row naming the file relative
    to the root; every normal run is listed; no path inside the root is shown, on / or a run page."""
    page.goto(f"{server}/")
    headers = "[...document.querySelectorAll('[data-testid=stDataFrame] thead th')].map(h => h.textContent)"
    columns = wait_until(page, lambda: page.evaluate(headers), timeout=30)
    status, error = columns.index("status"), columns.index("error")
    expected = [*UNREADABLE, *NORMAL, LOCKED_FILE]

    def table() -> dict[str, list[str]] | None:
        rows = runs_table_rows(page, "^normal-|^link-|^locked-")
        settled = sorted(rows) == sorted(expected) and rows[LOCKED_FILE][status] != "loading"
        return rows if settled else None

    rows = wait_until(page, table, timeout=30)
    assert list(rows)[: len(UNREADABLE)] == sorted(UNREADABLE)  # first: they hide runs until fixed
    assert {name: (rows[name][status], rows[name][error]) for name in UNREADABLE} == {
        name: ("⊘ unreadable", reason) for name, reason in UNREADABLE.items()
    }
    assert (rows[LOCKED_FILE][status], rows[LOCKED_FILE][error]) == (
        "! error",
        f"{LOCKED_FILE}/metrics.jsonl: cannot be opened: Permission denied",
    )
    assert all(rows[name][status] not in ("! error", "⊘ unreadable") for name in NORMAL)
    text = assert_nothing_injected(page)["text"]
    assert "Cannot list the runs" not in text and f"{root}/" not in text
    assert text.count(str(root)) == 1  # the caption naming the root it watches
    for name, reason in (
        (LOCKED_FILE, f"{LOCKED_FILE}/metrics.jsonl: cannot be opened: Permission denied"),
        ("locked-dir/inner", "Permission denied: 'locked-dir/inner/metrics.jsonl'"),
        ("link-loop", "leads outside the runs root, or nowhere"),
        ("nonexistent", "no metrics.jsonl under nonexistent"),
    ):
        page.goto(url_of(server, "run", name))
        wait_until(page, lambda reason=reason: reason in body_text(page), timeout=30)
        assert "Cannot show run" in body_text(page) and str(root) not in body_text(page), body_text(page)


# -- hostile names and ids ---------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE_RUNS)
def test_hostile_run_names_are_literal_titles_on_run_and_sessions(page: object, server: str, name: str) -> None:
    """A run called '**bold**', '<img …>' or '[x](https:/evil.example)' is its literal title, never markup."""
    for which, title in (("run", name), ("sessions", f"Sessions of {name}")):
        page.goto(url_of(server, which, name))
        heading = wait_until(page, lambda: (h := page.locator("h1")).count() and h.first.inner_text(), timeout=30)
        assert heading.strip() == title
        wait_until(page, lambda: page.locator(".js-plotly-plot").count() > 0, timeout=30)
        assert_nothing_injected(page)


def test_hostile_session_ids_on_the_run_page_are_text_and_the_long_one_is_cut(page: object, server: str) -> None:
    """Findings name both sessions: the link-shaped id is literal text, the 10k id ends in an ellipsis."""
    page.goto(url_of(server, "run", SESSIONS_RUN))
    health = popover_text(page, "Health").replace("\u2060", "")  # word joiners that stop autolinks
    assert LOGIN in health and "L" * 50 + "…" in health and LONG_ID not in health, health
    assert_nothing_injected(page)


def test_hostile_session_ids_and_values_on_the_sessions_page(page: object, server: str) -> None:
    """The sessions table names the sessions S1, S2 (their ids are in its CSV), and nothing of the
    hostile ids or values reaches the page as markup."""
    page.goto(url_of(server, "sessions", SESSIONS_RUN))
    (grid,) = wait_until(page, lambda: (grids := page.evaluate(GRID_JS, "[data-testid=stMain]"))
                         and len(grids[0]) == 3 and grids, timeout=30)  # fmt: skip
    # A grid cell is text whatever it holds; assert_nothing_injected checks the rest of the page.
    assert [row[0] for row in grid[1:]] == ["S1", "S2"]
    wait_until(page, lambda: page.locator(".js-plotly-plot").count() > 0, timeout=30)
    assert_nothing_injected(page)


def test_hostile_names_on_compare_and_overview(page: object, server: str) -> None:
    """Compare's legend and multiselect show hostile run names literally; the runs table too."""
    page.goto(url_of(server, "compare", *HOSTILE_RUNS, SESSIONS_RUN))
    graph = wait_until(page, lambda: page.evaluate(GRAPH_JS, "train loss"), timeout=30)
    names = {trace["name"] for trace in graph["traces"]}
    assert {"**bold**", "&lt;img src=x onerror=alert(1)&gt;", NESTED} <= names  # plotly decodes the entities
    legend = page.evaluate("document.querySelector('.js-plotly-plot .legend').textContent")
    assert "<img src=x onerror=alert(1)>" in legend and "**bold**" in legend and NESTED in legend
    assert_nothing_injected(page)
    page.goto(f"{server}/")
    rows = runs_table_rows(page, r"bold|img|evil|hostile")
    assert sorted(rows) == sorted([*HOSTILE_RUNS, SESSIONS_RUN])
    assert_nothing_injected(page)


# -- no tracebacks -------------------------------------------------------------------------------


# Each path and what its page says: good and bad query parameters alike.
PAGES_SHOWN = {
    "/": "Runs",
    "/run": "Choose a run",  # opened from the top bar: a run picker
    "/run?run=../../etc": "without '..'",
    "/run?run=nonexistent": "no run there",
    "/run?run=" + "n" * 5000: "Cannot show run",
    "/run?run=normal-a": "normal-a",
    "/sessions": "Choose a run",
    "/sessions?run=../../etc": "without '..'",
    "/sessions?run=normal-a": "Sessions of normal-a",
    "/compare": "Pick one or more runs",
    "/compare?run=x&run=**y**": "Not runs under the root, ignored: 'x', '**y**'",
    "/compare?run=normal-a&run=normal-b": "train loss",
}


def test_no_page_shows_a_traceback(alerts_recorded: object, server: str) -> None:
    """Good and bad query parameters alike: a plain page or a plain message, never a stack trace.
    The pages open side by side, one tab each; each is checked once its message is shown and again
    after its live fragment's next run."""
    tabs = {}
    for path in PAGES_SHOWN:
        tabs[path] = alerts_recorded.new_page()
        tabs[path].on("dialog", lambda dialog: dialog.dismiss())
        tabs[path].goto(server + path, wait_until="commit")
    try:
        for path, tab in tabs.items():
            try:
                wait_until(tab, lambda tab=tab, path=path: PAGES_SHOWN[path] in body_text(tab), timeout=30)
                assert_nothing_injected(tab)
            except AssertionError as error:
                raise AssertionError(f"{path[:100]}: {error}") from error
        next(iter(tabs.values())).wait_for_timeout(1500)  # a live fragment's next run must not fail either
        for path, tab in tabs.items():
            try:
                assert_nothing_injected(tab)
            except AssertionError as error:
                raise AssertionError(f"{path[:100]}, after its next run: {error}") from error
    finally:
        for tab in tabs.values():
            tab.close()
