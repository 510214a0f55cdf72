"""The live training-metrics dashboard.

    streamlit run app.py -- --runs /shared/runs [--refresh 0.5] [--poll] [--demo]

Everything here is navigation; pages live in pages/, logic in metrics_core.

This file is read twice.  ``streamlit run`` finds ``app = st.App(...)`` below, imports this file as
the module ``app`` and serves that ASGI app (uvicorn, Streamlit's own routes and config) with the
middleware of ``metrics_core.dashboard.serving`` in front: Streamlit's static files go out
gzip-compressed, each compressed once, as the server starts (issue 11: 1.8 MB instead of 3.9 MB on
a first load), the page's HTML names the server's base URL (no 404 probe of a deep link's own
path), preloads the chunks of the elements that page draws and, on chart pages, runs plotly.js as
soon as Streamlit's page is up, the pages' imports and Streamlit's once-per-process work are done
as the server starts, and Nagle's algorithm is off on its connections (each kept-alive request
used to wait ~40 ms for a delayed ACK).  Each page view then runs this same file as Streamlit's
script, under the name ``__main__``, which draws the navigation.  ``METRICS_SERVE_PLAIN=1``
serves exactly what Streamlit serves (for before/after benchmarks; a compressing reverse proxy in
front passes the gzip answers through as they are).

Every request the page makes goes to this server: the page icon is an emoji (Streamlit draws it
as an inline SVG; a ``:material/…:`` page icon makes every browser fetch the favicon from
fonts.gstatic.com, which fails on an air-gapped cluster and tells Google who opens the
dashboard), and the nav icons use the Material Symbols font Streamlit serves itself.
"""

import json
import os

import streamlit as st

if __name__ == "__main__":  # a page view: Streamlit runs this file as its script
    from metrics_core.dashboard.settings import maybe_start_demo, settings
    from metrics_core.dashboard.widgets import CALM_CSS

    st.set_page_config(page_title="Training metrics", page_icon="📈", layout="wide")
    st.html(CALM_CSS)
    maybe_start_demo(settings())
    st.navigation(
        [
            st.Page("pages/overview.py", title="Runs", icon=":material/table_rows:", default=True),
            st.Page("pages/run.py", title="Run", icon=":material/monitoring:", url_path="run"),
            st.Page("pages/sessions.py", title="Sessions", icon=":material/restart_alt:", url_path="sessions"),
            st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
        ],
        position="top",
    ).run()
else:  # `streamlit run app.py` imports this module to serve it
    from pathlib import Path

    from starlette.middleware import Middleware

    from metrics_core.dashboard.chart import (
        FIRST_CHART_ROUTE,
        PLOTLY_ASSETS,
        first_chart_json,
        first_chart_tags,
        plotly_file,
        plotly_head_tags,
    )
    from metrics_core.dashboard.charts import first_chart
    from metrics_core.dashboard.figures import THEMES
    from metrics_core.dashboard.serving import (
        GzipCopies,
        PreloadHints,
        StaticGzip,
        after_first_run,
        base_path,
        chunk_preloads,
        json_route,
        lifespan,
        static_files,
    )
    from metrics_core.dashboard.settings import close_stores, open_store, settings
    from metrics_core.dashboard.widgets import STORE_ERRORS

    # The lazily loaded chunks of the Streamlit elements each page draws (by url_path; "" is the
    # runs page), preloaded with the page's HTML instead of discovered as its elements arrive, and
    # the chart pages' by the runs page once it is drawn (a click to a run then finds them).
    # BidiComponent mounts the plotly.js loader and the charts.
    # fmt: off
    PAGE_ELEMENTS = {
        "": ("DataFrame", "Multiselect", "TextInput", "Html"),
        "run": ("BidiComponent", "Html", "Selectbox", "Slider", "Checkbox", "Radio", "PageLink", "DownloadButton",
                "rehype-raw"),
        "sessions": ("BidiComponent", "Html", "Metric", "Table", "ButtonGroup", "Slider", "PageLink", "DownloadButton",
                     "Selectbox", "remark-emoji"),
        "compare": ("BidiComponent", "Html", "Multiselect", "TextInput", "ButtonGroup", "Checkbox", "Slider"),
    }
    # fmt: on
    CHART_PAGES = ("run", "sessions", "compare")  # their HTML downloads and runs plotly.js

    ALL_ELEMENTS = tuple(dict.fromkeys(name for names in PAGE_ELEMENTS.values() for name in names))
    CHART_ELEMENTS = tuple(dict.fromkeys(name for page in CHART_PAGES for name in PAGE_ELEMENTS[page]))

    def page_head(page: str) -> tuple[str, str]:
        """The tags for the start and the end of this page's head: its plotly.js and element chunks;
        on a page without charts (the runs page, where a reader starts), once it is drawn and idle,
        the chart pages' chunks too.  Chart pages do not prepare the others: ~200 KB more on every
        chart page's first load.  The run page draws its first chart from its head, before
        Streamlit's page is up: its plotly.js is asked for, and run, ahead of Streamlit's scripts."""
        own = PAGE_ELEMENTS.get(page, ())
        plotly = plotly_head_tags(chart_page=page in CHART_PAGES)
        if page == "run":
            return plotly + first_chart_tags(), chunk_preloads(own)
        if page in CHART_PAGES:
            return "", plotly + chunk_preloads(own)
        others = chunk_preloads(CHART_ELEMENTS, without=own)
        return "", plotly + chunk_preloads(own) + after_first_run(
            f"document.head.insertAdjacentHTML('beforeend', {json.dumps(others)});"
        )

    copies = GzipCopies()

    def prewarm() -> None:
        """Each page's head tags (finding the chunks they preload reads and scans Streamlit's chunk
        files: ~30 ms on the event loop for a fresh server's first page HTML), and the gzip copies of
        what a first load of any page asks for: Streamlit's boot, the pages' element chunks,
        plotly.js."""
        for page in PAGE_ELEMENTS:
            page_head(page)
        plotly = plotly_file()
        copies.prewarm([*static_files(ALL_ELEMENTS), *([plotly] if plotly else [])])

    def first_chart_answer(query: dict[str, str]) -> bytes | None:
        """The run page's first chart for its HTML to draw (chart.first_chart_tags); None (204) for a
        run that cannot be shown now, which the page itself then explains."""
        run, theme = query.get("run", ""), query.get("theme", "")
        if not run or theme not in THEMES:
            return None
        try:
            view = open_store(settings()).view(run)
        except STORE_ERRORS:
            return None
        first = first_chart(view, theme)
        return None if first is None else first_chart_json(*first)

    plain = os.environ.get("METRICS_SERVE_PLAIN") == "1"
    base_url = st.get_option("server.baseUrlPath") or ""
    hints = Middleware(PreloadHints, base_url=base_url, head=page_head)
    gzipped = Middleware(StaticGzip, base_url=base_url, hashed=[PLOTLY_ASSETS], copies=copies)
    app = st.App(
        __file__,
        lifespan=lifespan(
            [] if plain else sorted(Path(__file__).with_name("pages").glob("*.py")),
            close_stores,
            no_delay=not plain,
            prewarm=None if plain else prewarm,
        ),
        middleware=[] if plain else [gzipped, hints],
        routes=[] if plain else [json_route(f"{base_path(base_url)}/{FIRST_CHART_ROUTE}", first_chart_answer)],
    )
