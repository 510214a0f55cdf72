"""A live plotly chart for Streamlit that keeps the user's zoom across data updates.

``st.plotly_chart`` remounts the chart whenever its data changes, which throws away zoom and
pan every second on a live run.  This is a ``st.components.v2`` component instead: it renders
into the page DOM (no iframe, so the graph is a ``.js-plotly-plot`` element whose ``data`` and
``layout`` automated checks can read) and redraws with ``Plotly.react``, which keeps the view while
``layout.uirevision`` is unchanged.

plotly.js is the copy shipped inside the ``plotly`` Python package (no network).  It is ~4.8 MB,
so it lives in a separate loader component mounted once per page: its element never changes,
so Streamlit's message cache sends it to each browser once, while chart updates carry only the
figure.
"""

from __future__ import annotations

import zlib
from functools import cache
from pathlib import Path

import plotly
import plotly.graph_objects as go
import streamlit as st

_ASSETS = Path(__file__).parent / "assets"


@cache
def _loader() -> object:
    source = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    return st.components.v2.component(
        "metrics_plotly_loader", js=source + "\nexport default function () {}\n", isolate_styles=False
    )


@cache
def _chart() -> object:
    return st.components.v2.component(
        "metrics_live_chart", js=(_ASSETS / "chart.js").read_text(encoding="utf-8"), isolate_styles=False
    )


def load_plotly() -> None:
    """Mount plotly.js once on this page; call before any ``live_chart``."""
    _loader()(key="metrics_plotly_loader", height="content")


def live_chart(figure: go.Figure, *, key: str) -> None:
    """Show ``figure``; later calls with the same ``key`` update it in place."""
    payload = figure.to_json()
    _chart()(key=key, data={"figure": payload, "revision": zlib.crc32(payload.encode())}, height="content")
