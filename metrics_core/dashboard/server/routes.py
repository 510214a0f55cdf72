"""Whether this process serves the dashboard's own routes (``st.App``'s public ``routes``).

``serving.app_options`` mounts them and its lifespan says so for as long as the server runs
(``serving_routes``); pages ask ``routes_served`` and, where they are not served (plain serving,
``AppTest``), do without them: a download button instead of a CSV link, a fragment rerun every
refresh period instead of one per change of the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from metrics_core.dashboard.live.chart_component import base_path

_served: list[bool] = []  # [True] while this process serves the routes


@contextmanager
def serving_routes(served: bool) -> Iterator[None]:
    """While inside, ``routes_served()`` is ``served`` (the server's lifespan)."""
    _served[:] = [True] if served else []
    try:
        yield
    finally:
        _served.clear()


def routes_served() -> bool:
    """Whether this process serves the dashboard's own routes now."""
    return bool(_served)


def route_url(path: str) -> str:
    """``path`` of one of the routes as the page asks for it (under ``server.baseUrlPath``)."""
    return f"{base_path(str(st.get_option('server.baseUrlPath') or ''))}{path}"
