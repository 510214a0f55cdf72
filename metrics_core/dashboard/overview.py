"""The runs table: filtering and links, as pure functions of the overview frame."""

from __future__ import annotations

import re
from urllib.parse import quote

import pandas as pd


def filter_runs(table: pd.DataFrame, pattern: str) -> tuple[pd.DataFrame, str | None]:
    """Rows whose run name matches ``pattern`` (a regex, searched); an invalid one filters nothing
    and comes back as an error message saying why."""
    if not pattern:
        return table, None
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        return table, f"Invalid regular expression {pattern!r}: {exc}. Showing all runs."
    return table[table["run"].map(lambda name: bool(regex.search(name)))], None


def run_link(name: str, page: str = "run") -> str:
    """Relative URL of a run's page: shareable, the name readable (only unsafe bytes escaped)."""
    return f"{page}?run={quote(name, safe='/')}"


def run_links(table: pd.DataFrame) -> pd.DataFrame:
    """The table with the run column turned into links to each run's page."""
    return table.assign(run=table["run"].map(run_link))
