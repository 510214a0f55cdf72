"""A long run's downsampled chart stays small."""

from __future__ import annotations

from pathlib import Path

from metrics_core.dashboard.figures.figure_dicts import figure_json
from metrics_core.dashboard.figures.run_charts import run_charts
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.views.chart_specs import ChartOptions


def test_downsampled_chart_json_stays_small(tmp_path: Path) -> None:
    """A 200k-window run's loss chart is well under the 200 KB budget and still has its last point."""
    from metrics_core.testing.generate import write_run

    write_run(tmp_path / "big" / "metrics.jsonl", 200_000)
    store = RunStore(tmp_path)
    try:
        view = store.view("big")
        figures = run_charts(view, ChartOptions(smoothing=0.6))
        for figure in figures.values():
            assert len(figure_json(figure)) < 200_000
        last_step = int(view.effective("train")["step"].iloc[-1])
        drawn = [t for t in figures["loss"].data if t.name.startswith("train") and t.hoverinfo != "skip"]
        assert max(max(t.x, default=0) for t in drawn) == last_step
    finally:
        store.close()
