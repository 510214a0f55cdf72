"""Text from run files made safe and sized for a terminal.

Every string read from a file (a session id, a reason, a path) passes through ``clean`` before it is
printed, so a hostile session id cannot move the cursor, recolour the terminal or reorder the line;
``fit`` and ``fit_middle`` cut it to a number of terminal columns (wide characters count two).
``duration`` and ``MISSING`` say a time span and an unknown value the same way everywhere.
``csv_cell`` keeps a CSV cell text in a spreadsheet (every CSV the product writes calls it).
"""

from __future__ import annotations

import math
import re
import unicodedata

MISSING = "—"  # where a value is unknown, in the terminal and on the page: never NaN or None

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-byte escapes, and the C1 CSI.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]|\x9b[0-?]*[ -/]*[@-~]")
# Bidi embeddings, overrides and isolates reorder what follows on the line ("Trojan Source").
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def clean(text: str) -> str:
    """``text`` safe to print: escape sequences, control characters and bidi controls removed.

    Line and paragraph separators and tabs go too: one record stays one line whatever it holds.
    """
    if text.isascii() and text.isprintable():
        return text  # the common case, ~100 ns
    text = _ESCAPES.sub("", text)
    return "".join(
        char
        for char in text
        if char not in _BIDI and unicodedata.category(char) not in ("Cc", "Zl", "Zp", "Cs", "Co", "Cn")
    )


# What a spreadsheet runs as a formula at the start of a cell (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER_CHARS = frozenset("0123456789+-.eE")


def csv_cell(text: str) -> str:
    """``text`` as a CSV cell that a spreadsheet shows as text: one starting like a formula
    (``FORMULA_STARTS``) gets a leading ``'``, unless it is a plain number (``-1.5``, ``+2e-3``:
    digits, sign, point and exponent only, so ``-inf`` is text).  A run name, key or value from a
    file is data: ``=HYPERLINK(…)`` in a cell would be a link the spreadsheet follows."""
    if not text.startswith(FORMULA_STARTS):
        return text
    if _NUMBER_CHARS.issuperset(text):
        try:
            float(text)
            return text
        except ValueError:
            pass
    return "'" + text


def width(text: str) -> int:
    """Terminal columns ``text`` takes: wide (CJK, emoji) characters 2, combining marks 0."""
    if text.isascii():
        return len(text)
    others = [char for char in text if not char.isascii()]  # an ASCII character takes one column
    return len(text) - len(others) + sum(_char_width(char) for char in others)


def _char_width(char: str) -> int:
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def fit(text: str, columns: int) -> str:
    """``text`` cut to at most ``columns`` terminal columns, ending in "…" when cut."""
    if width(text) <= columns:
        return text
    if text.isascii():  # a column a character
        return text[: max(0, columns - 1)] + "…"
    used, kept = 1, []  # the ellipsis takes one column
    for char in text:
        used += _char_width(char)
        if used > columns:
            break
        kept.append(char)
    return "".join(kept) + "…"


def fit_middle(text: str, columns: int) -> str:
    """``text`` in at most ``columns`` columns, keeping its start and end around a "…".

    For ids and paths, whose ends tell them apart (``…-pid40001``, ``…/my-run``).
    """
    if width(text) <= columns:
        return text
    tail_columns = (columns - 1) // 2
    if text.isascii():  # a column a character
        keep = max(0, tail_columns)
        return fit(text[: len(text) - keep], columns - keep) + text[len(text) - keep :]
    tail: list[str] = []
    used = 0
    for char in reversed(text):
        used += _char_width(char)
        if used > tail_columns:
            break
        tail.append(char)
    end = "".join(reversed(tail))
    return fit(text[: len(text) - len(end)], columns - width(end)) + end


def duration(seconds: float | None) -> str:
    """A duration a person reads at a glance, in its largest unit: 4.5 s, 45 s, 4.2 min, 3.1 h,
    2.5 d; ``MISSING`` when it is unknown or not finite.  A negative one keeps its sign."""
    if seconds is None or not math.isfinite(seconds):
        return MISSING
    size = abs(seconds)
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if size >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.2g} s" if size < 10 else f"{seconds:.0f} s"


def utf8(text: str) -> str:
    """``text`` encodable as UTF-8: a directory name the OS gave with undecodable bytes holds lone
    surrogates, which JSON cannot carry; they become their ``\\udcxx`` spelling."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
