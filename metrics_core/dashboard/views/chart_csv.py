"""A chart's rows as CSV: exactly what it draws (raw, not downsampled, not smoothed), from its
spec (``chart_specs.spec_makers``), written a piece at a time so a big run's CSV is sent as it is written."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd

from metrics_core.dashboard.display_text import csv_frame
from metrics_core.dashboard.store.snapshot import RunView
from metrics_core.dashboard.views.chart_specs import ChartOptions, ChartSpec, spec_makers

CSV_PIECE_ROWS = 20_000  # rows per piece of a chart's CSV, and per chunk pandas writes


def chart_csv_pieces(spec: ChartSpec) -> Iterator[str]:
    """Exactly the rows a chart draws (raw, not downsampled, not smoothed) as CSV, in pieces of
    ``CSV_PIECE_ROWS`` rows, the header first: a big run's CSV is sent as it is written, never
    held whole as text.  Each piece is one chunk of pandas' writer
    (which picks a time column's precision per chunk), so the pieces are the whole's text.  Run
    names, keys and session ids are data: one that starts like a formula is kept text
    (``display_text.csv_frame``)."""
    parts = []
    for item in spec.series:
        if item.column not in item.frame.columns:
            continue
        part = item.frame[["session_id", "step", "tokens_seen", "time", item.column]].rename(
            columns={item.column: "value"}
        )
        part.insert(0, "series", item.label)
        part.insert(1, "metric", item.column)
        part["superseded"] = item.superseded if item.superseded is not None else False
        parts.append(part)
    if not parts:
        return
    table = pd.concat(parts)
    for start in range(0, max(len(table), 1), CSV_PIECE_ROWS):
        piece = table.iloc[start : start + CSV_PIECE_ROWS]
        yield csv_frame(piece).to_csv(index=False, header=start == 0, chunksize=CSV_PIECE_ROWS)


def chart_csv_pieces_of(view: RunView, options: ChartOptions, key: str) -> Iterator[str]:
    """``chart_csv_pieces`` of the run page's chart ``key`` as ``options`` draw it (KeyError if the
    page has no such chart)."""
    return chart_csv_pieces(spec_makers(view, options.history, only=options.only, x=options.x)[key]())
