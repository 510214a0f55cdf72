"""Small Streamlit pieces shared by pages: the health panel, CSV buttons, run-name errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import streamlit as st

from metrics_core.dashboard.store import RunStore, RunView
from metrics_core.diagnostics import Finding
from metrics_core.errors import MetricsError, RunPathError

SEVERITY_ICONS = {"error": ":material/error:", "warning": ":material/warning:", "info": ":material/info:",
                  "ok": ":material/check_circle:"}  # fmt: skip


def view_or_stop(store: RunStore, name: str, *, refresh: float) -> RunView:
    """The run's view, or a clear message and a stopped page.

    A name that escapes the runs root is refused for good.  A run that does not exist (yet: a
    link opened before the trainer wrote its first record) is re-checked every ``refresh``
    seconds and the page reloads itself when it appears.
    """
    try:
        return store.view(name)
    except MetricsError as exc:
        st.error(f"Cannot show run {name!r}: {exc}")
        st.page_link("pages/overview.py", label="Back to all runs", icon=":material/arrow_back:")
        if not isinstance(exc, RunPathError):

            @st.fragment(run_every=refresh)
            def wait_for_run() -> None:
                try:
                    store.view(name)
                except MetricsError:
                    return
                st.rerun()

            wait_for_run()
        st.stop()
        raise  # unreachable: st.stop() ends the script


def views_or_warn(store: RunStore, names: Sequence[str]) -> dict[str, RunView]:
    """Views of the runs that can be shown; a warning names each one that cannot."""
    views = {}
    for name in names:
        try:
            views[name] = store.view(name)
        except MetricsError as exc:
            st.warning(f"Skipping run {name!r}: {exc}")
    return views


def health_panel(findings: Sequence[Finding]) -> None:
    """Diagnostics, worst first; a clean run is one line."""
    order = {"error": 0, "warning": 1, "info": 2, "ok": 3}
    worst = min(findings, key=lambda f: order[f.severity]).severity
    with st.expander(f"Health: {worst}", expanded=worst in ("error", "warning"), icon=SEVERITY_ICONS[worst]):
        for finding in sorted(findings, key=lambda f: order[f.severity]):
            st.markdown(f"{SEVERITY_ICONS[finding.severity]} **{finding.check}** — {finding.message}")


def csv_button(label: str, make: Callable[[], str], file_name: str, key: str) -> None:
    """A download button whose CSV is built only when clicked."""
    st.download_button(label, data=make, file_name=file_name, mime="text/csv", key=key,
                       icon=":material/download:", on_click="ignore", type="tertiary")  # fmt: skip
