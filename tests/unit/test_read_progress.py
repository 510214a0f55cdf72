"""The arithmetic of a read's progress: share read, rate, time left, and how they are said."""

from __future__ import annotations

import pytest

from metrics_core.read.read_progress import ReadProgress, byte_text, read_rate, seconds_text, time_left
from metrics_core.text import MISSING


def test_the_rate_is_bytes_over_seconds_and_unknown_before_anything_was_read() -> None:
    """No rate before a byte was read or before time passed: never 0 B/s or a division by zero."""
    assert read_rate(300_000_000, 3.0) == 100_000_000
    assert read_rate(0, 3.0) is None
    assert read_rate(1000, 0.0) is None


def test_the_time_left_is_what_remains_at_the_rate_so_far() -> None:
    """(total - done) / rate; 0 once done (a file that grew past the size taken reads as done); None without a rate."""
    assert time_left(300, 1000, 100.0) == pytest.approx(7.0)
    assert time_left(1000, 1000, None) == 0.0
    assert time_left(1200, 1000, 100.0) == 0.0
    assert time_left(300, 1000, None) is None
    assert time_left(300, 1000, 0.0) is None


def test_a_progress_gives_its_share_rate_and_time_left() -> None:
    """A progress combines them, its share clamped to [0, 1] and 0 for an unknown size."""
    progress = ReadProgress(done=312_000_000, total=780_000_000, elapsed_s=3.12)
    assert progress.fraction == pytest.approx(0.4)
    assert progress.rate == pytest.approx(100_000_000)
    assert progress.time_left_s == pytest.approx(4.68)
    assert ReadProgress(900, 800, 1.0).fraction == 1.0
    assert ReadProgress(0, 0, 0.0).fraction == 0.0


def test_a_progress_says_bytes_of_size_then_the_rate_and_time_left_once_known() -> None:
    """One line a user reads at a glance; the rate and time left only once there is a rate; no
    "0 B of 0 B" before the file's size is known."""
    assert ReadProgress(0, 0, 0.2).text() == "opening its file"
    assert ReadProgress(312_000_000, 780_000_000, 3.12).text() == "312 MB of 780 MB · 100 MB/s · 5 s left"
    assert ReadProgress(0, 780_000_000, 0.0).text() == "0 B of 780 MB"
    assert ReadProgress(780_000_000, 780_000_000, 8.0).text() == "780 MB of 780 MB · 98 MB/s · < 1 s left"


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 KB"), (1_234_567, "1.2 MB"), (780_000_000, "780 MB"), (2.5e12, "2.5 TB")],
)
def test_byte_counts_read_at_a_glance(count: float, text: str) -> None:
    """Decimal units, one decimal below 10 of a unit."""
    assert byte_text(count) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, MISSING), (0.2, "< 1 s"), (42.4, "42 s"), (185, "3 min 5 s"), (7440, "2 h 4 min")],
)
def test_times_left_read_at_a_glance(seconds: float | None, text: str) -> None:
    """Seconds, minutes, hours; unknown is the one missing mark."""
    assert seconds_text(seconds) == text
