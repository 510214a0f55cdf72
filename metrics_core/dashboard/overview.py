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
from urllib.parse import quote

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
