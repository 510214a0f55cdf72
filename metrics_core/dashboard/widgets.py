"""Small Streamlit pieces shared by pages: the health panel, CSV buttons, run-name errors, the SQL box.

Everything that puts an untrusted string (a run name, a session id, a reason from a file or a
URL) on the page goes through ``overview.md_text`` here or in the page, shortened first; and
every store call a page makes goes through a function here that turns ``MetricsError`` and
``OSError`` into a plain message, so no page shows a traceback for what it can foresee.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from metrics_core.dashboard.config import RunConfig, changes_table, config_diff, config_table, runs_table
from metrics_core.dashboard.display_text import (
    TITLE_CHARS,
    WORD_CHARS,
    clock_text,
    human_count,
    md_text,
    next_age_change,
    shorten,
    shorten_words,
    under_root,
)
from metrics_core.dashboard.figures import THEMES, session_colour, session_key
from metrics_core.dashboard.live_chart import LOADER_KEY
from metrics_core.dashboard.runs_table import (
    PAGE_ROWS,
    STATUS_BADGES,
    STATUS_COLOURS,
    filter_runs,
    readable_runs,
    run_links,
    runs_page,
    status_pills,
)
from metrics_core.dashboard.store import RunStore, RunView
from metrics_core.diagnostics import Finding
from metrics_core.errors import MetricsError, RunPathError
from metrics_core.text import fit_middle

SEVERITY_ICONS = {"error": ":material/error:", "warning": ":material/warning:", "info": ":material/info:",
                  "ok": ":material/check_circle:"}  # fmt: skip
SEVERITY_COLOURS = {"error": "red", "warning": "orange", "info": "blue", "ok": "green"}  # Streamlit's text colours
_THEME_READ = "_metrics_theme_read"  # st.session_state: a script run of this session has read the theme
STORE_ERRORS = (MetricsError, OSError)  # what a store call can foresee; anything else is a bug

SAME_TAB_KEY = "same_tab_links"  # the container of SAME_TAB_JS: no gap where it is mounted
PANELS_KEY = "run_panels"  # the run page's row of health and config buttons
SESSION_KEY_KEY = "session_key"  # the run page's session key

# Calm while live.  While a fragment reruns, Streamlit marks its elements data-stale="true" and
# fades them (charts flicker on every refresh of a slow run), and the top bar's running indicator
# blinks.  A refresh that changes
# nothing must change nothing on screen; a connection problem still shows.  The plotly.js loader
# (live_chart.load_plotly), the live refresh's watch (live_push.live_watch) and the same-tab link
# script draw nothing: out of the layout, they leave no gap where they are mounted.  The run page's
# row of health and config buttons and its session key stay one line each (scrolled sideways where
# they do not fit), so its charts have a known place; on a phone the key wraps instead: a key
# scrolled sideways hides the later sessions.
CALM_CSS = f"""<style>
[data-stale="true"] {{ opacity: 1 !important; transition: none !important; }}
[data-testid="stStatusWidget"]:has([data-testid="stStatusWidgetRunningIcon"]) {{ visibility: hidden; }}
.st-key-{LOADER_KEY} {{ display: none; }}
.st-key-{SAME_TAB_KEY} {{ display: none; }}
.st-key-{PANELS_KEY}, .st-key-{SESSION_KEY_KEY} p {{ overflow-x: auto; scrollbar-width: none; }}
.st-key-{SESSION_KEY_KEY} p {{ white-space: nowrap; }}
@media (max-width: 640px) {{ .st-key-{SESSION_KEY_KEY} p {{ white-space: normal; }} }}
</style>"""

# Links between pages open in this tab.  The runs table's link cells are opened by Streamlit
# with ``window.open(url, "_blank")`` (its LinkColumn; a new tab is a new session, which starts
# from scratch).  This script, run once per browser tab, turns such a call for a URL of this
# app into the navigation the Back button makes (``history.pushState`` then ``popstate``), which
# Streamlit answers by running that page with the URL's query in this session, as ``st.switch_page``
# would.  A link clicked with Ctrl, ⌘ or Shift held, or with the middle button, still opens a new
# tab, as a browser does with any link.  Constant code: no text from a file or a URL goes into it.
SAME_TAB_JS = """<script>
(() => {
  if (window.__sameTabLinks) return;
  window.__sameTabLinks = true;
  let newTab = false;
  const note = (e) => { newTab = e.ctrlKey || e.metaKey || e.shiftKey || e.button === 1; };
  window.addEventListener("pointerdown", note, true);
  window.addEventListener("mousedown", note, true);
  const open = window.open.bind(window);
  window.open = (url, target, features) => {
    let to = null;
    try { to = new URL(String(url), document.baseURI); } catch { /* not a URL: the browser's own way */ }
    if (!to || newTab || target !== "_blank" || to.origin !== location.origin) return open(url, target, features);
    history.pushState(null, "", to.href);
    window.dispatchEvent(new PopStateEvent("popstate"));
    return null;  // what window.open gives with noopener, as Streamlit asks
  };
})();
</script>"""


def name_text(name: str) -> str:
    """A run name inside a markdown message: quoted, shortened, escaped."""
    return md_text(repr(shorten(name, TITLE_CHARS)))


def reason_text(exc: BaseException, root: Path) -> str:
    """An exception's message for a markdown message: one line, paths relative to the runs ``root``,
    long tokens cut, escaped."""
    return md_text(shorten_words(under_root(" ".join(str(exc).split()) or type(exc).__name__, root)))


def view_or_stop(store: RunStore, name: str, *, refresh: float) -> RunView:
    """The run's view, or a clear message and a stopped page.

    A name that escapes the runs root is refused for good.  A run that does not exist (yet: a
    link opened before the trainer wrote its first record), or cannot be read right now, is
    re-checked every ``refresh`` seconds and the page reloads itself when it can be shown.
    """
    try:
        return store.view(name)
    except STORE_ERRORS as exc:
        st.error(f"Cannot show run {name_text(name)}: {reason_text(exc, store.root)}")
        st.page_link("pages/overview.py", label="Back to all runs", icon=":material/arrow_back:")
        if not isinstance(exc, RunPathError):

            @st.fragment(run_every=refresh)
            def wait_for_run() -> None:
                try:
                    store.view(name)
                except STORE_ERRORS:
                    return
                st.rerun()

            wait_for_run()
        st.stop()
        raise  # unreachable: st.stop() ends the script


def page_theme() -> str:
    """The browser's Streamlit theme, "light" or "dark", for the figure functions.

    A session's first script run is asked for before its page has applied the theme the server
    imposes (``theme.base``), and the browser reports the one it had (light on a light system): the
    charts were drawn light, then dark a refresh later.  That first run takes the server's theme (a
    reader who chose another in the settings menu gets it from the next refresh on).
    """
    kind = st.context.theme.type
    imposed = st.get_option("theme.base")
    if imposed in THEMES and not st.session_state.get(_THEME_READ):
        kind = imposed
    st.session_state[_THEME_READ] = True
    return kind if kind in THEMES else "light"


def run_or_pick(store: RunStore, *, refresh: float) -> RunView:
    """The view of the run named by ``?run=``; with no run named (the page opened from the top
    bar), a picker of the runs that sets the parameter, and a stopped page until one is chosen."""
    name = st.query_params.get("run", "")
    if name:
        return view_or_stop(store, name, refresh=refresh)
    names = run_names_or_stop(store)
    if not names:
        st.info("No runs under the root yet.")
        st.page_link("pages/overview.py", label="All runs", icon=":material/arrow_back:")
        st.stop()
    choice = st.selectbox("Choose a run", names, index=None, format_func=shorten, key="run_picker",
                          placeholder="Choose a run")  # fmt: skip
    if choice is None:
        st.stop()
    st.query_params["run"] = choice
    st.rerun()
    raise AssertionError("unreachable: st.rerun() ends the script")


def session_key_panel(view: RunView) -> None:
    """One key of the run's session colours for every chart on the page (charts list series only),
    on one line whatever the number of sessions (it scrolls sideways when it does not fit): the
    charts below it never move (``CALM_CSS``).

    Only generated text goes into this HTML: "S2", a hex colour from the palette, and a step number.
    """
    items = " ".join(f'<span style="color:{colour}">━ <b>{label}</b> {html.escape(what)}</span>'
                     for label, colour, what in session_key(view.sessions))  # fmt: skip
    faint = " · faint: superseded" if len(view.sessions) > 1 else ""
    with st.container(key=SESSION_KEY_KEY):
        st.markdown(f"Sessions: {items}{faint}", unsafe_allow_html=True)


RUNS_COLUMNS = {
    "status": st.column_config.MultiselectColumn(
        "status",
        options=list(STATUS_BADGES.values()),
        color=[STATUS_COLOURS[status] for status in STATUS_BADGES],
        help="live, stalled (no record for a while), finished, interrupted, failed, crashed (ended without "
        "saying so), error (cannot be read), unreadable (an entry of the root that cannot be looked into)",
    ),
    "run": st.column_config.LinkColumn(
        "run", display_text=r"run=(.*)$", help="Click a run (or tick its row): it opens here"
    ),
    "loss trend": st.column_config.LineChartColumn("loss trend", width="small", help="train loss, whole run"),
    "error": st.column_config.TextColumn(
        "error",
        help="why it stopped (the exception and the rank it came from, the signal, the failed write), "
        "or why it cannot be read",
    ),
}


@dataclass(frozen=True, eq=False)
class RunsPage:
    """One page of the runs table exactly as the runs page draws it, with what the page's filters
    and page picker made of the store's table: the live fragment builds one per change and redraws
    the page only when it differs from the one drawn (``same_as``), so runs changing off the page,
    or in a way the page does not show, never redraw it (nor lose a click on it)."""

    rows: pd.DataFrame  # the dataframe's data: readable values, status pills, run links
    names: tuple[str, ...]  # the run of each row, in drawn order
    total: int  # runs after the filters
    page: int
    pages: int
    errors: tuple[str, ...]  # what the filters could not apply, in plain text
    ages_change_at: float  # time.time() at which an age shown ("18 s ago") next reads differently

    def same_as(self, other: RunsPage | None) -> bool:
        """Whether drawing ``other`` instead would show exactly the same (O(page rows))."""
        return (
            other is not None
            and (self.total, self.page, self.pages, self.errors) == (other.total, other.page, other.pages, other.errors)
            and self.rows.equals(other.rows)
        )


def runs_page_view(table: pd.DataFrame) -> RunsPage:
    """The page of ``table`` (the store's overview) the filters, config columns and page picker of
    the runs page select, read from their session state: O(runs) to filter and sort, O(``PAGE_ROWS``)
    to format."""
    state = st.session_state
    shown, name_error = filter_runs(table, state.get("run_filter", ""))
    shown, config_error = runs_table(shown, keys=state.get("config_columns", []),
                                     config_filter=state.get("config_filter", ""))  # fmt: skip
    rows, page, pages = runs_page(shown, state.get("runs_page", 1))
    readable = readable_runs(rows)
    return RunsPage(
        rows=status_pills(run_links(readable)),
        names=tuple(readable["run"]),
        total=len(shown),
        page=page,
        pages=pages,
        errors=tuple(error for error in (name_error, config_error) if error),
        ages_change_at=time.time() + next_age_change(rows["last record age (s)"]),
    )


def runs_table_view(shown: RunsPage, drawn: RunsPage | None) -> None:
    """The runs table, one page of ``PAGE_ROWS`` at a time (newest activity first), with a page
    picker when there is more than one page; a click on a run's link (``SAME_TAB_JS``), or a tick
    on its row, opens that run in this tab.  ``drawn``: the page drawn before, which a tick's row
    number refers to (this run's rows may have moved since the click)."""
    for error in shown.errors:
        st.error(md_text(error))
    if shown.pages > 1:  # one page drawn: a live update of a big root redraws PAGE_ROWS rows, not every run
        st.session_state["runs_page"] = shown.page  # clamped: a filter that leaves fewer pages never overflows
        where, which = st.columns([4, 1], vertical_alignment="bottom")
        first = (shown.page - 1) * PAGE_ROWS + 1
        where.caption(f"Showing {first:,}–{first + len(shown.names) - 1:,} of {shown.total:,} runs, "
                      "newest activity first")  # fmt: skip
        which.number_input("Page", min_value=1, max_value=shown.pages, step=1, key="runs_page")
    with st.container(key=SAME_TAB_KEY):
        st.html(SAME_TAB_JS, unsafe_allow_javascript=True)
    picked = st.dataframe(shown.rows, hide_index=True, width="stretch", key="runs_table", on_select="rerun",
                          selection_mode="single-row", column_config=RUNS_COLUMNS)  # fmt: skip
    names = (drawn or shown).names
    if picked.selection.rows and picked.selection.rows[0] < len(names):
        st.switch_page("pages/run.py", query_params={"run": names[picked.selection.rows[0]]})


# One live fragment draws at a time in this server process, whatever the number of tabs.
_REFRESH_SLOT = threading.Lock()


@contextmanager
def refresh_slot() -> Iterator[None]:
    """Hold the server's one drawing slot while a live fragment draws its snapshot.

    Every tab's elements are sent by one thread, Streamlit's event loop, which competes for the GIL
    with every script thread.  Twenty tabs drawing at once starve it: their refreshes keep running
    while their messages queue unsent (and Streamlit drops a run's messages still queued when that
    tab's next refresh has started), so the tabs stop showing new records.  Drawing one tab at a
    time costs nothing in throughput (the GIL runs one at a time anyway) and leaves the event loop
    half of it; an overloaded server then refreshes each tab less often instead of never.  Take it
    only around drawing, never around a wait (``store.view`` may wait for a run being read):
    whatever holds it holds up every tab.
    """
    with _REFRESH_SLOT:
        yield


def live_view(store: RunStore, name: str) -> RunView | None:
    """In a live fragment: the run's latest view, or None after saying why it cannot be shown now
    (a run that turned unreadable keeps its page; the next refresh tries again)."""
    try:
        return store.view(name)
    except STORE_ERRORS as exc:
        st.error(f"Cannot show run {name_text(name)} right now: {reason_text(exc, store.root)}")
        return None


def overview_or_stop(store: RunStore) -> pd.DataFrame:
    """The runs table, or a plain message when the root itself cannot be listed."""
    try:
        return store.overview()
    except STORE_ERRORS as exc:
        st.error(f"Cannot list the runs: {reason_text(exc, store.root)}")
        st.stop()
        raise  # unreachable: st.stop() ends the script


def run_names_or_stop(store: RunStore) -> list[str]:
    """The names of the runs under the root, or a plain message when it cannot be listed."""
    try:
        return [run.name for run in store.runs()]
    except STORE_ERRORS as exc:
        st.error(f"Cannot list the runs: {reason_text(exc, store.root)}")
        st.stop()
        raise  # unreachable: st.stop() ends the script


def views_or_warn(store: RunStore, names: Sequence[str]) -> dict[str, RunView]:
    """Views of the runs that can be shown; a warning names each one that cannot."""
    views = {}
    for name in names:
        try:
            views[name] = store.view(name)
        except STORE_ERRORS as exc:
            st.warning(f"Skipping run {name_text(name)}: {reason_text(exc, store.root)}")
    return views


def health_panel(findings: Sequence[Finding]) -> None:
    """Diagnostics, worst first, behind one button of the run page's status row that says the
    worst severity in its colour and names the worst check: a glance tells whether the run is
    healthy, and a long list of findings never pushes the charts below the fold (the row is one
    line whatever the findings).  Messages embed session
    ids, bad-line reasons and excerpts from the file, so they are escaped and their long tokens cut."""
    order = {"error": 0, "warning": 1, "info": 2, "ok": 3}
    ranked = sorted(findings, key=lambda f: order[f.severity])
    worst = ranked[0]
    more = f" (+{len(ranked) - 1} more)" if len(ranked) > 1 else ""
    label = f"{worst.severity} — {md_text(shorten(worst.check, WORD_CHARS))}{more}" if worst.severity != "ok" else "ok"
    with st.popover(f":{SEVERITY_COLOURS[worst.severity]}[Health: {label}]", icon=SEVERITY_ICONS[worst.severity]):
        for finding in ranked:
            st.markdown(f"{SEVERITY_ICONS[finding.severity]} **{md_text(finding.check)}** — "
                        f"{md_text(shorten_words(finding.message))}")  # fmt: skip


def finding_text(finding: Finding) -> str:
    """A finding's message for ``st.warning`` and friends: escaped, long tokens cut."""
    return md_text(shorten_words(finding.message))


def table_text(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` for ``st.table``, which renders every cell as markdown: text cells escaped and
    shortened, numbers and times untouched."""
    cut = lambda value: md_text(shorten(value, WORD_CHARS)) if isinstance(value, str) else value  # noqa: E731
    text = table.select_dtypes(include=["object", "string"]).columns
    return table.assign(**{column: table[column].map(cut) for column in text})


def csv_button(label: str, make: Callable[[], str], file_name: str, key: str) -> None:
    """A download button whose CSV is built only when clicked."""
    st.download_button(label, data=make, file_name=file_name, mime="text/csv", key=key,
                       icon=":material/download:", on_click="ignore", type="tertiary")  # fmt: skip


def config_panel(config: RunConfig | None) -> None:
    """The run's config as a key → value table, and what changed at each resume, behind a button
    of the status row whose label says so (a learning rate changed on resume is what the user must
    not miss: the label names the keys).  Keys and values are dataframe cells (plain text); the
    session id is escaped."""
    if config is None:
        st.caption("No config logged", help="Pass `config=` to `training_session`, or call `write_config`.",
                   width="content")  # fmt: skip
        return
    changed = sorted({change.key for change in config.changes})
    label = f"Config ({len(config.values)} keys)"
    if changed:
        label += f" · :orange[changed at resume: {md_text(shorten(', '.join(changed), WORD_CHARS))}]"
    with st.popover(label, icon=":material/tune:"):
        session = f"S{config.session + 1}" if config.session is not None else "an unknown session"
        st.caption(f"From the config record of session {session} (id {md_text(repr(shorten(config.session_id, 40)))}, "
                   f"step {config.step}); {config.records} config record(s) in the run."
                   + (f" {config.dropped_keys} further keys not shown." if config.dropped_keys else ""))  # fmt: skip
        st.dataframe(config_table(config), hide_index=True, width="stretch")
        if config.changes:
            st.markdown("**Changed from the previous config record**")
            st.dataframe(changes_table(config), hide_index=True, width="stretch")


def config_diff_panel(configs: dict[str, dict[str, str] | None]) -> None:
    """The compare page's table: config keys by run, only those that differ unless asked."""
    st.subheader("Config")
    if not any(config is not None for config in configs.values()):
        st.caption("None of these runs logged a config.")
        return
    every_key = st.toggle("Show identical keys too", key="config_all")
    table = config_diff(configs, differing_only=not every_key)
    if table.empty:
        st.caption("Their configs are identical." if len(configs) > 1 else "Pick another run to see what differs.")
        return
    st.dataframe(table, width="stretch")


REASON_CHARS = 400  # a stop reason above the charts: an exception's message, within reason

# What each column of the sessions table means, shown on hover of its header.
SESSION_COLUMNS = {
    "session": "S1, S2, …: the session's colour on every chart of the run",
    "id": "the session_id its writer wrote (shortened in the middle; the CSV has it whole)",
    "start": "its first record (UTC)",
    "end": "its last record (UTC)",
    "duration": "from its first record to its last, h:mm:ss",
    "downtime before": "from the previous session's last record to this one's first: time the run did not train",
    "first step": "the step of its first record",
    "last step": "the step of its last record",
    "resume step": "the step it resumed from: the earlier sessions' records after it are superseded",
    "steps replayed": "steps an earlier session had already trained, trained again after this resume",
    "tokens replayed": "tokens of those steps, trained again (≤: a bound, where the records cannot place the resume "
    "inside a log window)",
    "records": "records it wrote",
    "discarded bytes": "torn tail the writer cut when this session opened the file (0: a clean start)",
    "skipped updates": "optimizer updates skipped in its windows (FP16 overflow)",
    "mean tokens/s": "tokens trained over its duration",
    "end status": "how it ended: its session_end record, else crashed (a later session exists) or the run's status",
    "reason": "why it ended: the exception (and the rank it came from), the signal, or what a crash means",
}


def sessions_table(table: pd.DataFrame, *, id_chars: int = 24) -> None:
    """``analysis.session_table`` as a data grid (cells are text, never markdown): durations as
    h:mm:ss, counts compact (1.2M), ids shortened in the middle, the session number in its chart
    colour, and each column explained on hover."""
    bounds = zip(table["tokens replayed"], table["tokens replayed is an upper bound"], strict=True)
    shown = table.assign(
        session=[f"S{number}" for number in table["session"]],
        id=table["id"].map(lambda text: fit_middle(str(text), id_chars)),
        duration=table["duration (s)"].map(clock_text),
        **{"tokens replayed": [("≤ " if bound else "") + human_count(tokens) for tokens, bound in bounds]},
        **{"downtime before": table["downtime before (s)"].map(clock_text)},
    )[list(SESSION_COLUMNS)]
    colours = [f"color: {session_colour(number - 1)}; font-weight: 600" for number in table["session"]]
    styled = shown.style.apply(lambda _: colours, subset=["session"])
    counts = ("steps replayed", "records", "discarded bytes", "skipped updates", "mean tokens/s")
    config = {column: st.column_config.Column(column, help=help) for column, help in SESSION_COLUMNS.items()}
    config |= {column: st.column_config.NumberColumn(column, help=SESSION_COLUMNS[column], format="compact")
               for column in counts}  # fmt: skip
    config |= {column: st.column_config.NumberColumn(column, help=SESSION_COLUMNS[column], format="localized")
               for column in ("first step", "last step", "resume step")}  # fmt: skip
    st.dataframe(styled, hide_index=True, column_config=config)


def stopped_panel(view: RunView) -> None:
    """Why the run stopped, above its charts: an interruption (a scheduler's SIGTERM) as a warning,
    a failure or a crash as an error; the reason comes from the file, so it is escaped and cut."""
    if not view.reason:
        return
    text = md_text(shorten_words(f"{view.status.capitalize()}: {view.reason}", REASON_CHARS))
    if view.status == "interrupted":
        st.warning(text, icon=":material/pause_circle:")
    else:
        st.error(text, icon=":material/error:")
