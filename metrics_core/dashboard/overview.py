"""Pure helpers of the pages: the runs table (filtering, links) and safe display text.

Run names, session ids, bad-line excerpts, reasons and metric values come from directory names,
files and URLs, so nothing here lets them become markup:

* ``md_text`` for anything Streamlit renders as markdown (``st.title``, ``st.markdown``,
  ``st.caption``, ``st.error`` and friends, ``st.table`` cells): every ASCII punctuation mark is
  backslash-escaped (CommonMark allows that for all of them), so no link, emphasis, code span,
  HTML tag, ``:material/…:`` or ``:red[…]`` directive, ``$math$`` or autolink can form;
  control characters become spaces so no line break can start a heading or a list.  Escapes
  do not stop GFM's autolink literals (Streamlit's markdown finds ``https://…``, ``www.…`` and
  ``a@b.c`` in the already-unescaped text, checked in a real browser), so a WORD JOINER
  (U+2060, invisible, no line break) is put into ``://``, ``www.`` and ``@``.
* ``plotly_text`` for plotly titles, trace names and annotations: plotly.js renders a subset of
  HTML there (``<a href>``, ``<b>``, ``<br>``), and decodes ``&lt;`` ``&gt;`` ``&amp;`` back for
  display, so escaping those three keeps the text exactly as written.
* ``shorten`` / ``shorten_words`` cut long strings with an ellipsis (a 10,000-character session
  id must not stretch the page).
"""

from __future__ import annotations

import re
import string
from datetime import datetime as _datetime
from urllib.parse import quote

import numpy as np
import pandas as pd

TITLE_CHARS = 80  # titles, names in messages, legend entries
WORD_CHARS = 60  # a single unbroken token inside a longer message (an id, an excerpt)
MESSAGE_CHARS = 600  # a whole message (diagnostic, error reason)
CELL_CHARS = 120  # a table cell
ELLIPSIS = "…"

_MARKDOWN_SPECIALS = re.compile("([" + re.escape(string.punctuation) + "])")
# Line breaks, other C0/C1 controls, and bidi overrides (which can make text read backwards).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
WORD_JOINER = "\u2060"
# The points where GFM's autolink literals start: "https:|//", "www|.", "a@|b".
_AUTOLINK_SHAPES = re.compile(r"(?<=:)(?=//)|(?i:(?<=www))(?=\.)|(?<=@)(?=[-\w])")
_LONG_WORD = re.compile(rf"\S{{{WORD_CHARS + 1},}}")


def shorten(text: object, limit: int = TITLE_CHARS) -> str:
    """``text`` as a string of at most ``limit`` characters, cut with an ellipsis when longer."""
    text = str(text)
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + ELLIPSIS


def shorten_words(text: object, limit: int = MESSAGE_CHARS, word_limit: int = WORD_CHARS) -> str:
    """A message with every overlong unbroken token cut (an id or excerpt inside a sentence keeps
    its start and the sentence keeps its end), then the whole cut to ``limit``."""
    return shorten(_LONG_WORD.sub(lambda match: shorten(match.group(), word_limit), str(text)), limit)


def md_text(text: object) -> str:
    """``text`` for a markdown context, shown literally: punctuation escaped, controls as spaces,
    URL and e-mail shapes broken by an invisible word joiner."""
    text = _AUTOLINK_SHAPES.sub(WORD_JOINER, _CONTROLS.sub(" ", str(text)))
    return _MARKDOWN_SPECIALS.sub(r"\\\1", text)


def plotly_text(text: object) -> str:
    """``text`` for a plotly text field, shown literally: no tag can form, line breaks as spaces."""
    text = _CONTROLS.sub(" ", str(text))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def file_stem(name: str) -> str:
    """A download file name from a run name: only ``[A-Za-z0-9._-]``, at most 100 characters."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:100] or "run"


def filter_runs(table: pd.DataFrame, pattern: str) -> tuple[pd.DataFrame, str | None]:
    """Rows whose run name matches ``pattern`` (a regex, searched); an invalid one filters nothing
    and comes back as an error message saying why (plain text: the page escapes it)."""
    if not pattern:
        return table, None
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        return table, f"Invalid regular expression {shorten(pattern)!r}: {exc}. Showing all runs."
    return table[table["run"].map(lambda name: bool(regex.search(name)))], None


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


# -- the runs table as people read it ------------------------------------------------------------

MISSING = "—"
# Marks any sans-serif font has (an emoji needs a colour-emoji font, which a cluster desktop may lack);
# the colour comes from STATUS_COLOURS, applied to the cell by the runs table's column config.
STATUS_BADGES = {
    "live": "● live", "stalled": "◐ stalled", "finished": "✓ finished", "interrupted": "■ interrupted",
    "failed": "✕ failed", "crashed": "✕ crashed", "error": "! error",
}  # fmt: skip
STATUS_COLOURS = {"live": "#21c354", "stalled": "#d4a000", "finished": "#1c83e1", "interrupted": "#ff8c00",
                  "failed": "#ff2b2b", "crashed": "#ff2b2b", "error": "#ff2b2b"}  # fmt: skip


def status_pills(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each status badge as a one-item list: the cell of a read-only multiselect
    column (``widgets.RUNS_COLUMNS``), which colours each badge by ``STATUS_COLOURS`` in the browser.
    A pandas Styler did that on the server at ~170 ms and 1.5 MB per drawn table of 1,000 runs."""
    return table.assign(status=table["status"].map(lambda badge: [badge]))


TREND_POINTS = 40  # a sparkline's points: enough for a shape, a few hundred bytes a row


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def human_count(value: object) -> str:
    """``22_040_000`` → ``"22.0M"``, ``1234`` → ``"1.2k"``, ``950`` → ``"950"``; missing → ``"—"``."""
    number = _number(value)
    if number is None:
        return MISSING
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(number) >= size:
            return f"{number / size:.1f}{suffix}"
    return f"{number:.0f}"


def human_value(value: object, digits: int = 4) -> str:
    """A loss or other measured value with ``digits`` significant digits; missing → ``"—"``."""
    number = _number(value)
    return MISSING if number is None else f"{number:.{digits}g}"


def age_text(seconds: object) -> str:
    """How long ago: ``"18 s ago"``, ``"4 min ago"``, ``"3 h ago"``, ``"2 d ago"``; missing → ``"—"``.

    The coarser the older, so an idle run's row changes once a minute at most, not every second.
    """
    number = _number(seconds)
    if number is None:
        return MISSING
    number = max(number, 0.0)
    for size, unit in ((86_400, "d"), (3_600, "h"), (60, "min")):
        if number >= size:
            return f"{int(number // size)} {unit} ago"
    return f"{int(number)} s ago"


def next_age_change(ages: object) -> float:
    """Seconds until any of ``ages`` (seconds, as ``age_text`` reads them; missing ones ignored)
    reads differently: a page showing them need not redraw before then.  ``inf`` when none will.
    O(rows) in numpy, paid once per drawn table, not per refresh."""
    array = pd.to_numeric(pd.Series(ages, dtype=object), errors="coerce").to_numpy(dtype=float)
    array = np.maximum(array[np.isfinite(array)], 0.0)
    if not len(array):
        return float("inf")
    unit = np.select([array < 60, array < 3_600, array < 86_400], [1.0, 60.0, 3_600.0], 86_400.0)
    return float(np.min(unit - array % unit))


def clock_text(seconds: object) -> str:
    """A duration as ``h:mm:ss`` (``"27:03:09"`` past a day); missing → ``"—"``."""
    number = _number(seconds)
    if number is None:
        return MISSING
    total = round(max(number, 0.0))
    return f"{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}"


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


def _stamp(value: object) -> str:
    """A start time to the minute, in UTC; missing (or NaT) → ``"—"``."""
    if not isinstance(value, _datetime) or pd.isna(value):
        return MISSING
    return value.strftime("%Y-%m-%d %H:%M UTC")


PAGE_ROWS = 100  # runs drawn per page: what a live update of a big root redraws and sends (~50 KB, not ~0.5 MB)


def newest_first(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (the store's overview) ordered by its last record's age, runs never read last."""
    return table.loc[table.sort_values("last record age (s)", na_position="last", kind="stable").index]


def runs_page(table: pd.DataFrame, page: int, rows: int = PAGE_ROWS) -> tuple[pd.DataFrame, int, int]:
    """Page ``page`` (from 1, clamped to the pages there are) of ``table`` newest activity first,
    the page it is and how many pages there are: the runs page formats and draws one page, so a
    live update of a root of 1,000 runs costs O(``rows``) in formatting and bytes, O(runs) only
    in sorting."""
    pages = max(1, -(-len(table) // rows))
    page = min(max(page, 1), pages)
    return newest_first(table).iloc[(page - 1) * rows : page * rows], page, pages


def readable_runs(table: pd.DataFrame) -> pd.DataFrame:
    """The runs table as the page shows it: newest activity first, status badges, human numbers,
    ages and durations as text; the run column stays the name (the page makes it a link).

    ``table`` is the store's overview, optionally with ``started`` (a datetime), ``duration (s)``
    and ``loss trend`` (a list of floats) per run.
    """
    table = newest_first(table)
    shown = pd.DataFrame({"run": table["run"], "status": table["status"].map(status_badge)})
    if "loss trend" in table.columns:
        shown["loss trend"] = table["loss trend"].map(lambda value: value if isinstance(value, list) else [])
    shown["train loss"] = table["train loss"].map(human_value)
    shown["val loss"] = table["val loss"].map(human_value)
    shown["last activity"] = table["last record age (s)"].map(age_text)
    if "started" in table.columns:
        shown["started"] = table["started"].map(_stamp)
    if "duration (s)" in table.columns:
        shown["duration"] = table["duration (s)"].map(clock_text)
    shown["sessions"] = table["sessions"].map(human_count)
    shown["last step"] = table["last step"].map(human_count)
    shown["tokens seen"] = table["tokens seen"].map(human_count)
    shown["skipped updates"] = table["skipped updates"].map(human_count)
    shown["bad lines"] = table["bad lines"].map(human_count)
    shown["error"] = table["error"].map(lambda text: shorten_words(text, CELL_CHARS) if isinstance(text, str) else "")
    extra = [column for column in table.columns if column not in OVERVIEW_KNOWN]
    for column in extra:
        shown[column] = table[column]
    return shown.reset_index(drop=True)


OVERVIEW_KNOWN = frozenset({"run", "status", "sessions", "last step", "tokens seen", "train loss", "val loss",
                            "skipped updates", "last record age (s)", "bad lines", "error", "config", "started",
                            "duration (s)", "loss trend", "last record time"})  # fmt: skip
