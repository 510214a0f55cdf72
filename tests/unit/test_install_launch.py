"""``metrics-dashboard``'s launcher without starting anything: the arguments it passes to Streamlit,
the app script it picks, and the warning when the server runs another copy of the package."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrics_core.dashboard.launch import app_script, package_origin, streamlit_arguments
from metrics_core.testing.live_server import REPO


def test_package_origin_warns_only_of_a_copy_that_is_not_the_app_scripts_own(tmp_path: Path) -> None:
    """An app script whose own package is elsewhere (another checkout) gets a warning naming both
    copies; the checkout's own app.py, whose package is this one, gets nothing to print."""
    line = package_origin(tmp_path / "app.py")
    assert line == (
        f"warning: this server runs metrics_core from {REPO / 'metrics_core'}, "
        f"not {tmp_path.resolve() / 'metrics_core'} beside the app script {tmp_path.resolve() / 'app.py'}"
    )
    assert package_origin(REPO / "app.py") is None


def test_metrics_dashboard_passes_port_and_host_to_streamlit_and_the_rest_to_the_app(tmp_path: Path) -> None:
    """--port and --host become Streamlit's server flags; every other option goes after ``--`` to the app."""
    argv = ["--runs", str(tmp_path), "--port", "9000", "--poll", "--host", "0.0.0.0", "--refresh", "2"]
    assert streamlit_arguments(argv, {}, Path("app.py")) == [
        "run", "app.py", "--server.port", "9000", "--server.address", "0.0.0.0",
        "--", "--runs", str(tmp_path), "--poll", "--refresh", "2",
    ]  # fmt: skip
    assert streamlit_arguments([], {}, Path("app.py")) == ["run", "app.py", "--"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--runz", "x"], "unrecognized arguments: --runz x"),
        (["--refresh", "0"], "--refresh must be a positive number"),
    ],
)
def test_metrics_dashboard_refuses_a_bad_option_before_any_server_starts(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown option or a bad value ends the command with the reason; no server is started."""
    with pytest.raises(SystemExit) as refused:
        streamlit_arguments(argv, {}, Path("app.py"))
    assert said in f"{refused.value}{capsys.readouterr().err}"


def test_metrics_dashboard_refuses_host_beyond_loopback_without_a_token() -> None:
    """``--host`` beyond loopback with ``METRICS_TOKEN=off`` is one line, before any server starts;
    with a token, or on loopback, it starts."""
    with pytest.raises(SystemExit) as refused:
        streamlit_arguments(["--host", "0.0.0.0"], {"METRICS_TOKEN": "off"}, Path("app.py"))
    assert str(refused.value).startswith("metrics-dashboard: refusing to listen on 0.0.0.0") and "\n" not in str(
        refused.value
    )
    secret = {"METRICS_TOKEN": "a-secret-of-16-chars"}
    assert "--server.address" in streamlit_arguments(["--host", "0.0.0.0"], secret, Path("app.py"))
    assert "--server.address" in streamlit_arguments(["--host", "127.0.0.1"], {"METRICS_TOKEN": "off"}, Path("app.py"))


@pytest.mark.parametrize("token", ["", "short"])
def test_metrics_dashboard_refuses_an_empty_or_short_token_before_any_server_starts(token: str) -> None:
    with pytest.raises(SystemExit) as refused:
        streamlit_arguments([], {"METRICS_TOKEN": token}, Path("app.py"))
    assert str(refused.value).startswith("metrics-dashboard: METRICS_TOKEN ") and "\n" not in str(refused.value)


def test_the_app_script_is_the_packaged_entry_when_installed_else_the_checkouts(tmp_path: Path) -> None:
    """An installed package serves its dashboard/entry/app.py; a checkout its own app.py."""
    installed = tmp_path / "site-packages" / "metrics_core" / "dashboard"
    (installed / "entry").mkdir(parents=True)
    (installed / "entry" / "app.py").touch()
    assert app_script(installed) == installed / "entry" / "app.py"
    assert app_script() == REPO / "app.py"
    with pytest.raises(SystemExit, match="no app script"):
        app_script(tmp_path / "elsewhere" / "metrics_core" / "dashboard")


def test_the_readme_install_brings_everything_the_installed_dashboard_uses() -> None:
    """requirements.txt (the README's one-line install) names every dependency of the ``app`` extra,
    the SQL box's engine among them: what the dashboard offers works after either install."""
    import re

    import tomllib

    def name(requirement: str) -> str:
        return re.split(r"[<>=;\[ ]", requirement, maxsplit=1)[0].strip().lower()

    app = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["app"]
    lines = (REPO / "requirements.txt").read_text().splitlines()
    installed = {name(line) for line in lines if line.strip() and not line.startswith("#")}
    assert "duckdb" in {name(r) for r in app}
    assert {name(r) for r in app} <= installed, sorted({name(r) for r in app} - installed)
