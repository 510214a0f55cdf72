"""The live training-metrics dashboard.

    streamlit run app.py -- --runs /shared/runs [--refresh 0.5] [--poll] [--demo] [--webhook URL] [--alerts-config FILE]
    streamlit run app.py -- --runs s3://bucket/prefix [--refresh 5] [--list-interval 60]

An installed package serves this same file (``metrics-dashboard --runs DIR``, ``launch.py``).
Everything here is navigation; pages live in pages/, logic in metrics_core.

This file is read twice.  ``streamlit run`` imports it as the module ``app`` and serves the
``st.App`` below, with what ``metrics_core.dashboard.server.serving`` adds (``METRICS_SERVE_PLAIN=1`` serves
exactly what Streamlit serves).  Each page view then runs it as Streamlit's script, under the name
``__main__``, which draws the navigation.

Every request the page makes goes to this server: the page icon is an emoji (a ``:material/…:``
page icon makes every browser fetch the favicon from fonts.gstatic.com, which fails on an
air-gapped cluster and tells Google who opens the dashboard), and the nav icons use the Material
Symbols font Streamlit serves itself.
"""

import streamlit as st

if __name__ == "__main__":  # a page view: Streamlit runs this file as its script
    from metrics_core.dashboard.settings import maybe_start_demo, settings
    from metrics_core.dashboard.widgets import CALM_CSS

    st.set_page_config(page_title="Training metrics", page_icon="📈", layout="wide")
    st.html(CALM_CSS)
    maybe_start_demo(settings())
    st.navigation(
        [
            st.Page("pages/runs.py", title="Runs", icon=":material/table_rows:", default=True),
            st.Page("pages/run.py", title="Run", icon=":material/monitoring:", url_path="run"),
            st.Page("pages/sessions.py", title="Sessions", icon=":material/restart_alt:", url_path="sessions"),
            st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
            st.Page("pages/sweep.py", title="Sweep", icon=":material/scatter_plot:", url_path="sweep"),
        ],
        position="top",
    ).run()
else:  # `streamlit run app.py` imports this module to serve it
    from metrics_core.dashboard.downloads import own_routes
    from metrics_core.dashboard.launch import package_origin
    from metrics_core.dashboard.server.serving import app_options
    from metrics_core.dashboard.settings import close_server

    if (other_copy := package_origin(__file__)) is not None:  # the server runs code from elsewhere
        print(other_copy, flush=True)
    # Written out as `app = st.App(...)`: `streamlit run` finds the app by reading this file's source.
    app = st.App(__file__, **app_options(__file__, shutdown=close_server, routes=own_routes))
