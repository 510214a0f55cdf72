"""Name filters: which charts (the run page) or runs (the runs and compare pages) a typed pattern
keeps, in time linear in the text.

The chart filter comes from a text box and from the query of the server's routes (``/api/csv``,
``/api/changes``), so anyone who can reach the server chooses it; the runs' from a text box.  A
regular expression there let one request hold the interpreter for ever (``(.|.|.|.)*!``
backtracks exponentially on a title of a few dozen characters).  So the pattern is not a regular
expression but a kind that cannot backtrack:

* ``|`` separates alternatives; a chart is kept when any of them matches its title or key;
* an alternative is literal text, compared ignoring case, in which ``*`` stands for any run of
  characters (none included); ``^`` first pins it to the start, ``$`` last to the end; blanks
  around it are ignored, and an empty alternative is no alternative;
* every other character, ``.``, ``(``, ``[`` and ``\\`` included, stands for itself.

Matching an alternative looks each ``*``-separated piece up once, leftmost after the previous
one (``str.find``): taking the leftmost place never loses a match when the only wildcard is
``*``, so no piece is ever tried again, and a match costs O(pieces x text) at worst, however the
pattern is written.  A pattern is at most ``FILTER_MAX_CHARS`` characters (``filter_error`` says
so); the page's box cannot hold more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

FILTER_MAX_CHARS = 200
FILTER_HELP = (
    "Charts whose title or key contains the text, ignoring case. `|` separates alternatives, "
    "`*` stands for any text, `^` and `$` pin an alternative to the start or the end of the name "
    "(e.g. `loss|val/` or `^sys/gpu*mem`). Every other character stands for itself."
)
RUN_FILTER_HELP = (
    "Runs whose name contains the text, ignoring case. `|` separates alternatives, `*` stands for "
    "any text, `^` and `$` pin an alternative to the start or the end of the name "
    "(e.g. `^llama*lr3e-4|baseline`). Every other character stands for itself."
)


@dataclass(frozen=True, slots=True)
class _Alternative:
    """One ``|``-separated alternative: its ``*``-separated pieces, lower-cased, and its anchors."""

    pieces: tuple[str, ...]
    start: bool
    end: bool

    def matches(self, text: str) -> bool:
        """Whether ``text`` (lower-cased) holds the pieces in order, anchored as asked.  Each piece
        is looked up once, at the leftmost place after the previous one: no backtracking."""
        first, *middle, last = self.pieces if len(self.pieces) > 1 else (*self.pieces, None)
        if self.start:
            if not text.startswith(first):
                return False
            at = len(first)
        else:
            found = text.find(first)
            if found < 0:
                return False
            at = found + len(first)
        if last is None:  # no "*": the one piece is the whole alternative
            return not self.end or (at == len(text) if self.start else text.endswith(first))
        for piece in middle:
            found = text.find(piece, at)
            if found < 0:
                return False
            at = found + len(piece)
        if self.end:
            return len(text) - len(last) >= at and text.endswith(last)
        return text.find(last, at) >= 0


@dataclass(frozen=True, slots=True)
class ChartFilter:
    """A parsed chart filter (``chart_filter``): ``keeps(title, key)``; no alternatives keeps all."""

    alternatives: tuple[_Alternative, ...]

    def keeps(self, *names: str) -> bool:
        """Whether any alternative matches any of ``names`` (a chart's title and key)."""
        if not self.alternatives:
            return True
        lowered = [name.lower() for name in names]
        return any(alternative.matches(name) for alternative in self.alternatives for name in lowered)


def filter_error(pattern: str, what: str = "chart filter") -> str | None:
    """Why ``pattern`` is refused as a ``what``, or None when it is usable."""
    if len(pattern) > FILTER_MAX_CHARS:
        return f"The {what} is {len(pattern)} characters long; at most {FILTER_MAX_CHARS} are allowed."
    return None


def chart_filter(pattern: str, what: str = "chart filter") -> ChartFilter:
    """``pattern`` parsed (see the module docstring); ``ValueError`` (``filter_error``'s words,
    naming it a ``what``) for a refused one."""
    if error := filter_error(pattern, what):
        raise ValueError(error)
    alternatives = []
    for text in pattern.lower().split("|"):
        text = text.strip()
        start, end = text.startswith("^"), text.endswith("$") and len(text) > text.startswith("^")
        text = text[int(start) : len(text) - int(end)]
        if text or start or end:
            alternatives.append(_Alternative(tuple(text.split("*")), start, end))
    return ChartFilter(tuple(alternatives))


def chart_picks(pattern: str, named: Iterable[tuple[str, ...]]) -> list[bool]:
    """Whether chart filter ``pattern`` keeps each of ``named`` (a chart's title and key), in one
    call for a run page's every chart; a refused pattern (``filter_error``) keeps all."""
    keeps = chart_filter("" if filter_error(pattern) else pattern).keeps
    return [keeps(*names) for names in named]
