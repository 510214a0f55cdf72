"""Building figures and charts imports no plotly: checked in a fresh interpreter."""

from __future__ import annotations

from tests.support import REPO


def test_figures_and_charts_import_no_plotly() -> None:
    """Figures are plain dicts and JSON: a fresh interpreter importing the figure builders loads no
    plotly (Streamlit itself imports plotly, so the server's memory is the same either way)."""
    import subprocess
    import sys

    code = ("import sys; import metrics_core.dashboard.views.chart_specs, "
            "metrics_core.dashboard.figures.metric_figures, metrics_core.dashboard.figures.rank_figures; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('plotly', '_plotly_utils')))")  # fmt: skip
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=REPO).stdout.strip()  # fmt: skip
    assert found == "[]"
