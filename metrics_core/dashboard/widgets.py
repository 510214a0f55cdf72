"""The plumbing every page needs: the page-wide CSS and script (``CALM_CSS``, ``SAME_TAB_JS``), the
theme, the run a page shows (``run_or_pick``), the server's drawing slot, CSV buttons, and the
store calls a page makes.

Everything that puts an untrusted string (a run name, a session id, a reason from a file or a
URL) on the page goes through ``display_text.md_text`` here or in the page, shortened first; and
every store call a page makes goes through a function here that turns ``MetricsError`` and
``OSError`` into a plain message, so no page shows a traceback for what it can foresee.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import streamlit as st

from metrics_core.dashboard.display_text import TITLE_CHARS, WORD_CHARS, md_text, shorten, shorten_words, under_root
from metrics_core.dashboard.figures.layout import THEMES
from metrics_core.dashboard.live.chart_component import LOADER_KEY
from metrics_core.dashboard.panels import PANELS_KEY, SESSION_KEY_KEY
from metrics_core.dashboard.store.run_store import RunStore, RunView
from metrics_core.errors import MetricsError, RunPathError
from metrics_core.read.read_progress import ReadProgress

_THEME_READ = "_metrics_theme_read"  # st.session_state: a script run of this session has read the theme
STORE_ERRORS = (MetricsError, OSError)  # what a store call can foresee; anything else is a bug

SAME_TAB_KEY = "same_tab_links"  # the container of SAME_TAB_JS: no gap where it is mounted

# Calm while live.  While a fragment reruns, Streamlit marks its elements data-stale="true" and
# fades them (charts flicker on every refresh of a slow run), and the top bar's running indicator
# blinks.  A refresh that changes
# nothing must change nothing on screen; a connection problem still shows.  The plotly.js loader
# (chart_component.load_plotly), the live refresh's watch (push.live_watch) and the same-tab link
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


READING_KEY = "run_reading"  # the container of a run's read progress (``show_reading``)
PROGRESS_S = 0.5  # the longest between two draws of a read's progress
# The share of that period each draw then waits for the read's end: the page reruns as the read
# ends, not at the next draw, and a click on the page waits no longer than that share.
READ_END_WAIT = 0.6
_READING = "_metrics_reading"  # st.session_state: the runs ``views_or_warn`` last drew as being read


def show_reading(name: str, progress: ReadProgress) -> None:
    """How far the read of run ``name`` has come: a progress bar with bytes read of the file's
    size, the rate and the time left.  A read that fails is said by the page's next ``view`` call
    (``view_or_stop``, ``views_or_warn``), where this bar was."""
    with st.container(key=f"{READING_KEY}_{abs(hash(name))}"):
        st.progress(progress.fraction, text=f"Reading run {name_text(name)}: {progress.text()}")


def wait_for_read(store: RunStore, name: str, *, title: str, refresh: float) -> None:
    """Return at once unless showing run ``name`` would wait for a read (a big run not read yet,
    or being read by the store's loader); then draw the page's ``title`` (markdown) and the read's
    progress, moving every ``PROGRESS_S`` at most, until the run can be shown, rerun the page as
    soon as it can (each draw waits ``READ_END_WAIT`` of the period for the read's end), and stop
    the script here: a page never waits blind.  The read runs beside the page
    (``RunStore.prepare``), so closing the tab costs it nothing."""
    try:
        reading = store.prepare(name)
    except STORE_ERRORS:
        return  # no such run, or refused: the page's own call says why
    if reading is None:
        return
    st.title(title, wrap=False)

    period = min(refresh, PROGRESS_S)

    def progress_or_rerun(wait: float) -> ReadProgress:
        try:
            now = store.prepare(name, wait=wait)
        except STORE_ERRORS:
            now = None  # the page's own call says why
        if now is None:
            st.rerun()
        return now

    @st.fragment(run_every=period)
    def progress() -> None:
        show_reading(name, progress_or_rerun(0.0))
        progress_or_rerun(READ_END_WAIT * period)

    progress()
    st.stop()


def view_or_stop(store: RunStore, name: str, *, refresh: float, title: str = "{}") -> RunView:
    """The run's view, or a clear message and a stopped page.

    A run being read shows ``title`` (a format string given the run's name as markdown) and the
    read's progress until it can be shown (``wait_for_read``).  A name that escapes the runs root
    is refused for good.  A run that does not exist (yet: a link opened before the trainer wrote
    its first record), or cannot be read right now, is re-checked every ``refresh`` seconds and
    the page reloads itself when it can be shown.
    """
    wait_for_read(store, name, title=title.format(md_text(shorten(name))), refresh=refresh)
    try:
        return store.view(name)
    except STORE_ERRORS as exc:
        st.error(f"Cannot show run {name_text(name)}: {reason_text(exc, store.root)}")
        st.page_link("pages/runs.py", label="Back to all runs", icon=":material/arrow_back:")
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


def run_or_pick(store: RunStore, *, refresh: float, title: str = "{}") -> RunView:
    """The view of the run named by ``?run=`` (``view_or_stop``: ``title`` while it is read); with
    no run named (the page opened from the top bar), a picker of the runs that sets the parameter,
    and a stopped page until one is chosen."""
    name = st.query_params.get("run", "")
    if name:
        return view_or_stop(store, name, refresh=refresh, title=title)
    names = run_names_or_stop(store)
    if not names:
        st.info("No runs under the root yet.")
        st.page_link("pages/runs.py", label="All runs", icon=":material/arrow_back:")
        st.stop()
    choice = st.selectbox(
        "Choose a run", names, index=None, format_func=shorten, key="run_picker", placeholder="Choose a run"
    )
    if choice is None:
        st.stop()
    st.query_params["run"] = choice
    st.rerun()
    raise AssertionError("unreachable: st.rerun() ends the script")


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


def demo_note(demo: Path, user_root: Path) -> None:
    """What the runs page says while it shows the demo's runs (kept in ``demo``, the dashboard's
    own directory) in place of the user's root, and when that ends."""
    st.info(
        md_text(
            "A demo: a small sweep (two learning rates × two seeds, one run killed and resumed) trained live "
            f"by metrics_core, kept in the dashboard's own {demo.resolve()}. Your runs under "
            f"{user_root.resolve()} take its place as soon as the first one is written."
        ),
        icon=":material/science:",
    )


def runs_table_or_stop(store: RunStore) -> pd.DataFrame:
    """The runs table, or a plain message when the root itself cannot be listed."""
    try:
        return store.runs_table()
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


def views_or_warn(store: RunStore, names: Sequence[str], *, progress: bool = False) -> dict[str, RunView]:
    """Views of the runs that can be shown; a warning names each one that cannot.  A run still
    being read is left out, never waited for (its read goes on beside the page: ``RunStore.prepare``);
    with ``progress`` (in a live fragment) its read's progress is drawn instead, and the page
    reruns once a run so drawn can be shown, so that what the page offers of it (its keys) joins."""
    views, reading = {}, set()
    for name in names:
        try:
            found = store.prepare(name)
            if found is None:
                views[name] = store.view(name)
            elif progress:
                show_reading(name, found)
                reading.add(name)
        except STORE_ERRORS as exc:
            st.warning(f"Skipping run {name_text(name)}: {reason_text(exc, store.root)}")
    if progress:
        read = st.session_state.get(_READING, set()) & views.keys()
        st.session_state[_READING] = reading
        if read:
            st.rerun()
    return views


def table_text(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` for ``st.table``, which renders every cell as markdown: text cells escaped and
    shortened, numbers and times untouched."""
    cut = lambda value: md_text(shorten(value, WORD_CHARS)) if isinstance(value, str) else value  # noqa: E731
    text = table.select_dtypes(include=["object", "string"]).columns
    return table.assign(**{column: table[column].map(cut) for column in text})


def csv_button(label: str, make: Callable[[], str], file_name: str, key: str) -> None:
    """A download button whose CSV is built only when clicked."""
    st.download_button(
        label,
        data=make,
        file_name=file_name,
        mime="text/csv",
        key=key,
        icon=":material/download:",
        on_click="ignore",
        type="tertiary",
    )
