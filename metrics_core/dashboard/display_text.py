"""Text from files and URLs made safe to show, and values made readable.

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
* ``under_root`` says every path inside the runs root relative to it, as a run name: a message
  (an ``OSError``'s, a reader's) names the file the way the page's reader knows it, and no page
  shows where the server keeps its files.
* ``csv_frame`` for a CSV the page sends (a chart's rows, the SQL box's answer): each text cell
  and column name a spreadsheet would run as a formula is kept text (``text.csv_cell``).
* ``shorten`` / ``shorten_words`` cut long strings with an ellipsis (a 10,000-character session
  id must not stretch the page).
* ``human_count``, ``human_value``, ``age_text``, ``clock_text``, ``stamp_text``: numbers, ages,
  durations and times (UTC, to the second) as people read them; a missing or non-finite value
  reads ``MISSING``.
"""

from __future__ import annotations

import os
import re
import string
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from metrics_core.text import FORMULA_STARTS, MISSING, csv_cell

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


# What may come before a path in a message: its start, a space, a quote or an opening bracket;
# so "/srv/runs" is not taken out of "/old/srv/runs/…" or "archive/srv/runs/…".
_PATH_START = r"(?<![^\s'\"(\[=])"


def under_root(text: str, root: str | os.PathLike[str]) -> str:
    """``text`` with every path inside ``root`` (as given, absolute or resolved) said relative to
    it: ``[Errno 13] Permission denied: '/srv/runs/a/metrics.jsonl'`` reads ``… 'a/metrics.jsonl'``.
    The root itself is left as it is: it is what the dashboard was started on.  A bucket root
    (``s3://bucket/prefix``) has one form."""
    if "://" in str(root):
        forms = {str(root).rstrip("/")}
    else:
        root = Path(root)
        forms = {str(root), str(root.absolute()), os.path.realpath(root)} - {"", ".", "/"}
    forms = sorted(forms, key=len, reverse=True)
    pattern = _PATH_START + "(?:" + "|".join(map(re.escape, forms)) + ")/+"
    return re.sub(pattern, "", text)


def plotly_text(text: object) -> str:
    """``text`` for a plotly text field, shown literally: no tag can form, line breaks as spaces."""
    text = _CONTROLS.sub(" ", str(text))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell and column name that starts like a formula made text by
    ``text.csv_cell`` (numbers, ``-1.5`` as text included, stay as they are); ``frame`` itself when
    nothing needs it.  Only the cells found by a vectorized prefix test are looked at one by one."""
    names = [csv_cell(name) if isinstance(name, str) else name for name in frame.columns]
    safe = frame if names == list(frame.columns) else frame.set_axis(names, axis=1)
    for position in range(frame.shape[1]):
        column = frame.iloc[:, position]
        if not (pd.api.types.is_string_dtype(column) or isinstance(column.dtype, pd.CategoricalDtype)):
            continue
        text = column.astype(object)
        try:
            formula = text.str.startswith(FORMULA_STARTS, na=False).astype(bool)
        except AttributeError:  # an object column holding no text
            continue
        if formula.any():
            safe = safe.copy() if safe is frame else safe
            safe.isetitem(position, text.where(~formula, text[formula].map(csv_cell)))
    return safe


def file_stem(name: str) -> str:
    """A download file name from a run name: only ``[A-Za-z0-9._-]``, at most 100 characters."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:100] or "run"


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
    """How long ago: ``"18 s ago"``, ``"4 min ago"``, ``"3 h ago"``, ``"2 d ago"``; missing → ``"—"``;
    a time more than a second in the future → ``"clock ahead"``.

    The coarser the older, so an idle run's row changes once a minute at most, not every second.
    """
    number = _number(seconds)
    if number is None:
        return MISSING
    if number < -1.0:  # the writer's clock runs ahead of the server's: no negative ages
        return "clock ahead"
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


def stamp_text(value: object, *, date: bool = True) -> str:
    """A time in UTC to the second (``"2026-12-07 21:39:22"``; without ``date``, ``"21:39:22"``);
    missing (or NaT) → ``"—"``."""
    if not isinstance(value, datetime) or pd.isna(value):
        return MISSING
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")
