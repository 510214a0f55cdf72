"""Numbers, times and sizes as the terminal commands print them: fixed columns, plain text.

Each helper answers ``MISSING`` ("—") for a value that is missing or not a number, never ``NaN``
or ``None``; strings from a file are the caller's to pass through ``text.clean`` first.
"""

from __future__ import annotations

import math
from typing import Any

from metrics_core.read.session_model import as_datetime, number
from metrics_core.text import MISSING, fit, width

ID_COLUMNS = 16  # session ids, shortened in the middle: their ends tell sessions apart


def pad(text: str, columns: int, *, right: bool = False) -> str:
    """``text`` cut or padded to exactly ``columns`` terminal columns."""
    text = fit(text, columns)
    fill = " " * (columns - width(text))
    return fill + text if right else text + fill


def stamp(time_ns: int) -> str:
    """A record's time, to the second, in UTC."""
    return as_datetime(time_ns).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def value_text(value: Any, spec: str) -> str:
    """A numeric field formatted with ``spec``, or "—" when it is missing or not a number."""
    as_number = number(value)
    if as_number is None or not math.isfinite(as_number):
        return MISSING
    return format(as_number, spec)


def count_text(value: int | None, columns: int = 14) -> str:
    """An integer with thousands separators, or in k/M/G/T/P/E when that would not fit ``columns``."""
    if value is None:
        return MISSING
    text = f"{value:,}"
    if len(text) <= columns:
        return text
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return text


def rate_text(value: float | None) -> str:
    """A rate (tokens/s) in at most seven columns: 950, 12.34k, 1.20M."""
    if value is None:
        return MISSING
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def bytes_text(value: int | None) -> str:
    """A size in B, kB, MB or GB (binary units), three significant digits."""
    if value is None:
        return MISSING
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value} B"


def loss_text(value: float) -> str:
    """A loss with four decimals, or in scientific notation when that would hide it."""
    return f"{value:.4f}" if 1e-3 <= abs(value) < 1e5 else f"{value:.3e}"
