"""Long work shown on a terminal, and nothing in a log: the progress bar of the terminal commands.

The library functions behind ``export``, ``query``, ``sync``, ``summary`` and ``tail`` take a
progress callback, ``progress(done, total)``, called after each unit of their work (runs, or
bytes of a file) with absolute figures, so the library keeps no state for it.  ``progress_bar`` turns that
into a bar on stderr, only when stderr is a terminal and ``--quiet`` was not given; in cron, a
pipe or a CI log the callback draws nothing and ``tqdm`` is never imported.

The bar: tqdm, which training scripts already use, where it is installed (the head node's
extras bring it); else, on a training node with orjson alone, one plain line of its own
(``progress_line``) redrawn in place.  Both redraw at most every ``MIN_INTERVAL_S``, so an update
between two redraws costs a clock read.  A bar starts at the first figure that leaves work to do
(none for work already done, nor a read of one block: tqdm is imported only then), shows its
total before it ends, then clears its line: the command's own output follows in its place.
``clear`` takes it off the line before a command writes to the same terminal mid-work (``tail``);
the next redraw puts it back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TextIO

from metrics_core.cli.terminal import bytes_text, count_text
from metrics_core.text import duration, fit, width

MIN_INTERVAL_S = 0.1  # redraws at most this often: a bar costs the work nothing measurable
BYTES = "B"  # the unit of a bar over a file's bytes; any other unit is a noun, counted ("run")
_BAR_COLUMNS = 20  # the built-in line's bar, in characters


def progress_line(label: str, done: int, total: int, *, rate: float | None, unit: str, columns: int) -> str:
    """The built-in bar as one line of at most ``columns``: what, how far, the rate (``unit`` a
    second, None before it is known) and the time left."""
    share = min(done / total, 1.0) if total > 0 else 1.0
    filled = round(share * _BAR_COLUMNS)
    bar = "#" * filled + "-" * (_BAR_COLUMNS - filled)
    if unit == BYTES:
        line = f"{label} {share:4.0%} [{bar}] {bytes_text(done)}/{bytes_text(total)}"
        speed = "" if rate is None else f"{bytes_text(round(rate))}/s"
    else:
        line = f"{label} {share:4.0%} [{bar}] {count_text(done)}/{count_text(total)} {unit}s"
        speed = "" if rate is None else f"{rate:.3g} {unit}s/s"
    if rate is not None and rate > 0:
        line += f" {speed}"
        if done < total:
            line += f" {duration((total - done) / rate)} left"
    return fit(line, columns)


class _Silent:
    """No terminal, or ``--quiet``: every call does nothing."""

    def update(self, done: int, total: int) -> None:
        """Nothing to draw."""

    def clear(self) -> None:
        """Nothing drawn."""

    def close(self) -> None:
        """Nothing drawn."""


class _LineBar:
    """The built-in bar: ``progress_line`` redrawn in place with a carriage return (module docstring)."""

    def __init__(self, err: TextIO, label: str, unit: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.err, self.label, self.unit, self.clock = err, label, unit, clock
        self._started: tuple[float, int] | None = None  # when the bar started, and the done figure then
        self._figures = (0, 0)
        self._drawn_at = 0.0
        self._shown = 0  # columns on the line now

    def update(self, done: int, total: int) -> None:
        """Note ``done`` of ``total``; redraw when ``MIN_INTERVAL_S`` has passed since the last."""
        now = self.clock()
        if self._started is None:
            if done >= total:
                return
            self._started = (now, done)
        self._figures = (done, total)
        if not self._shown or now - self._drawn_at >= MIN_INTERVAL_S:
            self._draw(now)

    def _draw(self, now: float) -> None:
        assert self._started is not None
        began, before = self._started
        done, total = self._figures
        rate = (done - before) / (now - began) if now > began and done > before else None
        line = progress_line(self.label, done, total, rate=rate, unit=self.unit, columns=_columns(self.err))
        self._write("\r" + line + " " * max(self._shown - width(line), 0))
        self._shown, self._drawn_at = width(line), now

    def _write(self, text: str) -> None:
        self.err.write(text)
        self.err.flush()

    def clear(self) -> None:
        """Take the bar off its line (the next update draws it again)."""
        if self._shown:
            self._write("\r" + " " * self._shown + "\r")
            self._shown = 0

    def close(self) -> None:
        """Draw the last figures, then clear the line; a later update starts a new bar."""
        if self._started is not None:
            self._draw(self.clock())
            self.clear()
        self._started = None


def _columns(err: TextIO) -> int:
    """The terminal's width, less one column: a line that fills the last column wraps on some
    terminals; 79 where the terminal does not say (a width of 0)."""
    try:
        columns = os.get_terminal_size(err.fileno()).columns
    except (OSError, ValueError):
        columns = 0
    return max(columns - 1, 20) if columns else 79


class _TqdmBar:
    """tqdm's bar, started at the first figure that leaves work to do (module docstring)."""

    def __init__(self, tqdm: Any, err: TextIO, label: str, unit: str) -> None:
        self.tqdm, self.err, self.label, self.unit = tqdm, err, label, unit
        self._bar: Any = None

    def update(self, done: int, total: int) -> None:
        """Note ``done`` of ``total``; tqdm redraws at most every ``MIN_INTERVAL_S``."""
        if self._bar is None:
            if done >= total:
                return
            self._bar = self.tqdm(
                desc=self.label,
                total=total,
                initial=done,
                file=self.err,
                unit=self.unit,
                unit_scale=self.unit == BYTES,
                unit_divisor=1024,
                mininterval=MIN_INTERVAL_S,
                dynamic_ncols=True,
                leave=False,
            )
            return
        self._bar.total = total
        self._bar.update(done - self._bar.n)

    def clear(self) -> None:
        """Take the bar off its line (tqdm draws it again at its next redraw)."""
        if self._bar is not None:
            self._bar.clear()

    def close(self) -> None:
        """Draw the last figures, then clear the line; a later update starts a new bar."""
        if self._bar is not None:
            self._bar.refresh()
            self._bar.close()
        self._bar = None


class Bar(Protocol):
    """What ``progress_bar`` yields: ``update`` is the progress callback (module docstring)."""

    def update(self, done: int, total: int) -> None: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


class _Terminal:
    """A bar on a terminal, tqdm's or the built-in line, chosen at the first figure that leaves work
    to do: work too short for a bar never imports tqdm."""

    def __init__(self, err: TextIO, label: str, unit: str) -> None:
        self.err, self.label, self.unit = err, label, unit
        self._bar: _LineBar | _TqdmBar | None = None

    def update(self, done: int, total: int) -> None:
        """Note ``done`` of ``total`` (module docstring)."""
        if self._bar is None:
            if done >= total:
                return
            try:
                from tqdm import tqdm  # the head node's extras install it; a training node may not have it
            except ImportError:
                self._bar = _LineBar(self.err, self.label, self.unit)
            else:
                self._bar = _TqdmBar(tqdm, self.err, self.label, self.unit)
        self._bar.update(done, total)

    def clear(self) -> None:
        """Take the bar off its line."""
        if self._bar is not None:
            self._bar.clear()

    def close(self) -> None:
        """End the bar; a later update starts a new one."""
        if self._bar is not None:
            self._bar.close()


@contextmanager
def progress_bar(err: TextIO, label: str, *, unit: str, quiet: bool = False) -> Iterator[Bar]:
    """A bar on ``err`` for work counted in ``unit`` (``BYTES`` or a noun), closed on the way out:
    silent unless ``err`` is a terminal and not ``quiet`` (module docstring).  Its ``update`` is
    the progress callback to hand the library."""
    bar: Bar = _Silent() if quiet or not err.isatty() else _Terminal(err, label, unit)
    try:
        yield bar
    finally:
        bar.close()
