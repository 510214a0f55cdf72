"""The package as a user installs it (``pip install 'metrics-core[app]'``, a wheel in a venv of its own,
metrics_core/testing/wheel_venv.py): it holds every module and asset of the checkout, ``metrics-dashboard`` serves
the dashboard from it, and a checkout's app.py runs the checkout's code.  The browser
half (the live chart drawn, plotly.js from the browser's cache) is in test_browser_bytes.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from metrics_core.testing.live_server import ACCESS_TOKEN, REPO, free_port, installed_dashboard, served
from metrics_core.testing.wheel_venv import installed_package, outside_checkout
from tests.support import small_run


def checkout_files(folder: str) -> set[str]:
    """The files git tracks under ``folder`` of the checkout, relative to it."""
    listed = subprocess.run(
        ["git", "ls-files", folder], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return {str(Path(name).relative_to(folder)) for name in listed if (REPO / name).is_file()}


def test_the_wheel_installs_every_module_and_asset_of_the_package_and_the_apps_files(wheel_venv: Path) -> None:
    """Every file of metrics_core/ (modules, chart runtime, vendored plotly.js, Streamlit's component
    manifest) is installed byte for byte, and app.py, pages/ and .streamlit/config.toml as
    dashboard/entry/: pyproject.toml lists the packages, so a new one missing from the list fails here."""
    package = installed_package(wheel_venv)
    assert package.is_relative_to(wheel_venv.resolve()) and package != REPO / "metrics_core"
    expected = {f"metrics_core/{name}": name for name in checkout_files("metrics_core")}
    expected |= {name: f"dashboard/entry/{name}" for name in ("app.py", ".streamlit/config.toml")}
    expected |= {f"pages/{name}": f"dashboard/entry/pages/{name}" for name in checkout_files("pages")}
    assert "metrics_core/pyproject.toml" in expected and "metrics_core/dashboard/vendor/plotly-basic.min.js" in expected
    missing = [source for source, installed in expected.items() if not (package / installed).is_file()]
    assert not missing, f"not in the wheel: {missing}"
    differ = [
        source
        for source, installed in expected.items()
        if (package / installed).read_bytes() != (REPO / source).read_bytes()
    ]
    assert not differ, f"installed, but not as in the checkout (a stale $METRICS_WHEEL_VENV?): {differ}"


def test_metrics_dashboard_serves_the_installed_package_from_anywhere(wheel_venv: Path, tmp_path: Path) -> None:
    """``metrics-dashboard --runs DIR --port N``, started outside the checkout, serves the installed
    package's own app script and code (no warning of another copy) and prints one URL, with its token."""
    small_run(tmp_path / "runs" / "small" / "metrics.jsonl")
    with installed_dashboard(wheel_venv, tmp_path / "runs", cwd=tmp_path) as (url, log):
        log.seek(0)
        said = log.read().decode(errors="replace")
    assert "warning: this server runs metrics_core" not in said, said
    # The packaged .streamlit/config.toml applies outside the checkout: loopback only, and none of
    # Streamlit's own tokenless URLs, so the one URL printed is the one to open.
    assert re.findall(r"https?://\S+", said) == [f"{url}/?token={ACCESS_TOKEN}"], said


def test_a_checkouts_app_py_runs_the_checkouts_code_beside_an_installed_copy(wheel_venv: Path, tmp_path: Path) -> None:
    """``streamlit run <checkout>/app.py`` with the venv's Streamlit, where an installed metrics_core
    is importable too, runs the checkout's package: its log has no warning of another copy (the
    warning's text is in tests/unit/test_install_launch.py)."""
    (tmp_path / "runs").mkdir()
    port = free_port()
    command = [str(wheel_venv / "bin" / "python"), "-m", "streamlit", "run", str(REPO / "app.py"),
               "--server.port", str(port), "--", "--runs", str(tmp_path / "runs")]  # fmt: skip
    with served(command, port, cwd=tmp_path, env=outside_checkout(dict(os.environ)), what="app.py") as (_, log):
        log.seek(0)
        said = log.read().decode(errors="replace")
    assert "warning: this server runs metrics_core" not in said and "Open the dashboard" in said, said


def test_the_installed_package_answers_sql_over_a_root(wheel_venv: Path, tmp_path: Path) -> None:
    """``pip install 'metrics-core[app]'`` brings the SQL box's engine: ``query`` answers over a root."""
    small_run(tmp_path / "runs" / "small" / "metrics.jsonl")
    command = [str(wheel_venv / "bin" / "python"), "-m", "metrics_core", "query", str(tmp_path / "runs"),
               "SELECT run FROM runs", "--format", "csv", "--cache-dir", str(tmp_path / "cache"),
               "--quiet"]  # fmt: skip
    answered = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env=outside_checkout(dict(os.environ)))  # fmt: skip
    assert answered.returncode == 0 and answered.stdout.split() == ["run", "small"], answered


def test_python_m_metrics_core_serve_is_metrics_dashboard() -> None:
    """``python -m metrics_core serve --help`` is the dashboard command's help."""
    helped = subprocess.run([sys.executable, "-m", "metrics_core", "serve", "--help"], capture_output=True, text=True,
                            timeout=60, check=True)  # fmt: skip
    assert "usage: metrics-dashboard" in helped.stdout and "--runs" in helped.stdout and "--port" in helped.stdout
