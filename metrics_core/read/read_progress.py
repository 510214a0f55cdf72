"""How far a long read has come, as the pages and the terminal say it: bytes read of the file's
size, the rate so far, the time left at that rate.

Pure values and arithmetic, no clock and no I/O: whoever reads (``RunReader``, through the store)
publishes two integers, and whoever shows the read samples them with its own clock.  A rate is
only said once something was read over a measurable time, and a time left only with a rate: a
made-up "0 B/s, ∞ left" helps nobody.
"""

from __future__ import annotations

from dataclasses import dataclass

from metrics_core.text import MISSING

_UNITS = ("B", "KB", "MB", "GB", "TB")


@dataclass(frozen=True, slots=True)
class ReadProgress:
    """``done`` bytes of ``total`` read in ``elapsed_s`` seconds since the read began."""

    done: int
    total: int
    elapsed_s: float

    @property
    def fraction(self) -> float:
        """Share read, in [0, 1] (a file that grew past the size taken at the start reads as 1)."""
        if self.total <= 0:
            return 0.0
        return min(max(self.done / self.total, 0.0), 1.0)

    @property
    def rate(self) -> float | None:
        """Bytes per second so far; None before anything was read over a measurable time."""
        return read_rate(self.done, self.elapsed_s)

    @property
    def time_left_s(self) -> float | None:
        """Seconds left at the rate so far; None without a rate."""
        return time_left(self.done, self.total, self.rate)

    def text(self) -> str:
        """One line: "312 MB of 780 MB · 95 MB/s · 5 s left" (rate and time left once known);
        "opening its file" before the file's size is known."""
        if self.total <= 0:
            return "opening its file"
        parts = [f"{byte_text(min(self.done, self.total))} of {byte_text(self.total)}"]
        rate, left = self.rate, self.time_left_s
        if rate is not None:
            parts.append(f"{byte_text(rate)}/s")
        if left is not None:
            parts.append(f"{seconds_text(left)} left")
        return " · ".join(parts)


def read_rate(done: int, elapsed_s: float) -> float | None:
    """``done`` bytes over ``elapsed_s`` seconds, or None when either is not positive."""
    if done <= 0 or elapsed_s <= 0:
        return None
    return done / elapsed_s


def time_left(done: int, total: int, rate: float | None) -> float | None:
    """Seconds to read the ``total - done`` bytes left at ``rate`` bytes per second; 0 once done;
    None without a positive rate."""
    if done >= total:
        return 0.0
    if rate is None or rate <= 0:
        return None
    return (total - done) / rate


def byte_text(count: float) -> str:
    """A byte count at a glance: "780 MB", "1.2 GB", "512 B" (decimal units, as ``ls -h --si``)."""
    value, unit = float(count), 0
    while value >= 1000 and unit < len(_UNITS) - 1:
        value, unit = value / 1000, unit + 1
    if unit == 0:
        return f"{int(value)} B"
    return f"{value:.1f} {_UNITS[unit]}" if value < 10 else f"{value:.0f} {_UNITS[unit]}"


def seconds_text(seconds: float | None) -> str:
    """A time left at a glance: "< 1 s", "42 s", "3 min 5 s", "2 h 4 min"."""
    if seconds is None:
        return MISSING
    whole = round(seconds)
    if whole < 1:
        return "< 1 s"
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"
