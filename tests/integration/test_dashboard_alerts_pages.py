"""The dashboard's alerts on its pages, run in-process by AppTest: a NaN run's alert on the runs
page and its own, and unusable alert settings said on the page while the runs still show."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import open_page
from tests.support.alerts import nan_and_healthy_runs, write_losses


def shown(markdown: str) -> str:
    """What a reader sees of escaped markdown (URL shapes are broken by an invisible word joiner)."""
    return re.sub(r"\\(.)", r"\1", markdown).replace("\u2060", "")


@pytest.fixture
def stop_server_objects() -> Iterator[None]:
    """The pages' alerter threads (and stores) stop after the test, as the server's shutdown does."""
    yield
    from metrics_core.dashboard.settings import close_server

    close_server()


def warnings_of(app: object) -> str:
    return "\n".join(shown(warning.value) for warning in app.warning)


def test_a_nan_run_shows_a_firing_alert_on_the_overview_and_its_page(runs_root: Path, stop_server_objects) -> None:
    """The server's alerter finds the NaN the writer recorded: the runs page lists it (and not the
    healthy run), the NaN run's page shows it in its status rows, the healthy run's page nothing."""
    nan_and_healthy_runs(runs_root)
    app = open_page("runs")
    deadline = time.monotonic() + 30

    def first_pass_shown() -> bool:  # the alert may show while the first pass still reads other runs
        reading = any("first time" in caption.value for caption in app.caption)
        return "nonfinite_loss" in warnings_of(app) and not reading

    while not first_pass_shown() and time.monotonic() < deadline:
        app.run()  # the alerter's first pass runs beside the first page view
    assert not app.exception
    runs_page = warnings_of(app)
    assert "Firing alerts" in runs_page and "nan · nonfinite_loss since " in runs_page
    assert "train loss was NaN or infinite at step" in runs_page and "ok ·" not in runs_page
    assert not any("first time" in caption.value for caption in app.caption)
    run_page = open_page("run", run="nan")
    assert not run_page.exception
    assert "nonfinite_loss since " in warnings_of(run_page)
    assert "nonfinite_loss" not in warnings_of(open_page("run", run="ok"))


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [("METRICS_ALERTS_CONFIG", None, "alerts.toml: spike_z is -1.0: expected a finite number >= 0"),
     ("METRICS_WEBHOOK", "ftp://host/secret", "webhook 'ftp://host/…': expected an http:// or https:// URL"),
     ("METRICS_WEBHOOK", "https://hooks.slack.com/services/T0/B0/sec ret",
      "webhook 'https://hooks.slack.com/…': the URL holds a space or a control character")],
)  # fmt: skip
def test_unusable_alert_settings_are_said_on_the_page_and_the_runs_still_show(
    runs_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stop_server_objects,
    variable: str,
    value: str | None,
    why: str,
) -> None:
    """An alerts config or webhook that cannot be used: the runs page says which and why (the
    webhook's secret path left out), and still lists the runs."""
    config = tmp_path / "alerts.toml"
    config.write_text("spike_z = -1.0\n")
    monkeypatch.setenv(variable, value or str(config))
    write_losses(runs_root / "ok", [2.0, 1.9])
    app = open_page("runs")
    assert not app.exception
    assert shown(app.error[0].value).startswith("Alerts are off: ") and why in shown(app.error[0].value)
    assert list(app.dataframe[0].value["run"]) == ["run?run=ok"]
    assert "secret" not in shown(app.error[0].value) and "sec ret" not in shown(app.error[0].value)
