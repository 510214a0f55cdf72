"""``metrics-dashboard``: the dashboard of the installed package, started like ``tensorboard --logdir``.

    pip install 'metrics-core[app]'
    metrics-dashboard --runs DIR [--port 8501] [--host 127.0.0.1] [--refresh S] [--poll] [--demo] ...

It is ``streamlit run <app script> -- <the dashboard's options>``, where the app script is the one
of the package it was installed with (``app_script``).  The wheel ships the repository's
``app.py``, ``pages/`` and ``.streamlit/config.toml`` as ``metrics_core/dashboard/entry/``
(pyproject.toml maps them there: one copy of each, in the repository), so the installed command
serves the same pages as a checkout, and Streamlit reads the ``.streamlit/config.toml`` beside the
script wherever the command is started from (loopback only, headless: README).  ``--port`` and
``--host`` become Streamlit's ``--server.port`` and ``--server.address``; other Streamlit settings
go through its ``STREAMLIT_*`` environment variables.  An unknown option, an empty or short
``METRICS_TOKEN``, or ``--host`` beyond loopback with access control off (``METRICS_TOKEN=off``),
is refused before any server starts.

Streamlit runs in this process through the ``streamlit`` console script its distribution declares
(package metadata, not a private import), so Ctrl-C and SIGTERM reach its server directly.
``import metrics_core.dashboard.launch`` imports no Streamlit: without the ``app`` extra the command
says what to install.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path

_HERE = Path(__file__).resolve().parent  # metrics_core/dashboard


def app_script(dashboard: Path = _HERE) -> Path:
    """The app script the package in ``dashboard`` (its ``metrics_core/dashboard`` directory) serves:
    ``entry/app.py`` in an installed package, else ``app.py`` of the checkout it lives in."""
    for script in (dashboard / "entry" / "app.py", dashboard.parents[1] / "app.py"):
        if script.is_file():
            return script
    raise SystemExit(f"metrics-dashboard: {dashboard} has no app script (entry/app.py, or app.py two levels up)")


def package_origin(script: str | Path) -> str | None:
    """A warning when the server runs another copy of ``metrics_core`` than the one beside the app
    script ``script``, else None (the usual case says nothing).  Streamlit puts the script's
    directory first on ``sys.path``, so a checkout's app.py runs the checkout's package, but a
    copy imported earlier (an installed one, a ``PYTHONPATH``) would win, and edits to the
    checkout would then change nothing the server shows."""
    script = Path(script).resolve()
    own = script.parents[2] if script.parent.name == "entry" else script.parent / "metrics_core"
    package = _HERE.parent
    if package == own.resolve():
        return None
    return f"warning: this server runs metrics_core from {package}, not {own} beside the app script {script}"


def streamlit_arguments(argv: Sequence[str], environ: Mapping[str, str], script: Path) -> list[str]:
    """The arguments of ``streamlit`` for ``metrics-dashboard argv``: ``run script [--server.port N]
    [--server.address H] -- <the dashboard's options>``; ``SystemExit`` (with argparse's message) on
    an unknown option or a bad value, ``--help`` prints every option."""
    from metrics_core.dashboard.server.access import refuse_open_bind, server_token
    from metrics_core.dashboard.settings import parse_settings, settings_parser

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--port", type=int, help="the port to listen on (default: Streamlit's, 8501)")
    own.add_argument("--host", help="the address to listen on (default 127.0.0.1: tunnel with ssh -L, see README)")
    argparse.ArgumentParser(
        prog="metrics-dashboard",
        description="Serve the live training-metrics dashboard of this installed package.",
        parents=[own, settings_parser(environ)],
    ).parse_args(argv)
    ours, dashboard_args = own.parse_known_args(argv)
    parse_settings(dashboard_args, environ)  # the app's own refusals (--refresh 0, a cache inside the runs root)
    try:
        token = server_token(environ)  # the server reads it again; refused here before Streamlit starts
    except SystemExit as refused:
        raise SystemExit(f"metrics-dashboard: {refused}") from None
    if ours.host is not None and (refusal := refuse_open_bind(ours.host, token)) is not None:
        raise SystemExit(f"metrics-dashboard: {refusal}")  # before Streamlit prints a URL that will not answer
    server = [
        *(["--server.port", str(ours.port)] if ours.port is not None else []),
        *(["--server.address", ours.host] if ours.host is not None else []),
    ]
    return ["run", str(script), *server, "--", *dashboard_args]


def main(argv: Sequence[str] | None = None) -> None:
    """The ``metrics-dashboard`` command (module docstring); does not return while the server runs."""
    argv = sys.argv[1:] if argv is None else list(argv)
    streamlit = next(iter(entry_points(group="console_scripts", name="streamlit")), None)
    if streamlit is None:
        raise SystemExit("metrics-dashboard needs the dashboard's dependencies: pip install 'metrics-core[app]'")
    arguments = streamlit_arguments(argv, os.environ, app_script())
    streamlit.load()(args=arguments, prog_name="streamlit")
