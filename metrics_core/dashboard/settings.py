"""Dashboard settings from the command line (``streamlit run app.py -- ...``) and the environment,
and the process-wide objects built from them (one store, one alerter, at most one demo)."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import streamlit as st

from metrics_core.alerts.rules import AlertConfig, load_config
from metrics_core.alerts.webhooks import WEBHOOK_VARIABLE, command_line_warning
from metrics_core.dashboard.alerting import ServerAlerter
from metrics_core.dashboard.demo import start_demo
from metrics_core.dashboard.display_text import md_text
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import RECENT_S, StoreSettings
from metrics_core.dashboard.views.memo import view_findings
from metrics_core.errors import MetricsError
from metrics_core.read.column_cache import CachePolicy, default_directory
from metrics_core.read.columns import return_large_frees_at_once
from metrics_core.roots.discovery import find_runs
from metrics_core.roots.locations import LIST_INTERVAL_S, is_bucket_url

# A refresh that finds nothing new costs a dict lookup in the store and a few bytes per chart, and
# an update costs O(new records), so pages poll twice a second (write -> visible:
# benchmarks/bench_live.py).
DEFAULT_REFRESH_S = 0.5


@dataclass(frozen=True)
class Settings:
    runs: Path | str  # a directory, or a bucket prefix ``s3://bucket/prefix`` (a string)
    refresh: float
    poll: bool
    demo: bool
    cache: Path | None  # the dashboard's own cache directory; None: no cache
    webhook: str | None = None  # where alerts are posted; None: the config's, else only shown
    alerts_config: Path | None = None  # the alert rules' TOML file; None: the default rules
    list_interval: float = LIST_INTERVAL_S  # a bucket root is listed at most this often
    demo_of: Path | None = None  # showing the demo's runs (``runs``) while this, the user's root, holds none
    webhook_warning: str | None = None  # a webhook URL on the command line, readable by every user


def runs_root(text: str) -> Path | str:
    """``--runs``: ``s3://bucket/prefix`` stays a string (a path would fold its ``//``), else a path."""
    return text if is_bucket_url(text) else Path(text)


def settings_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The dashboard's options, with their defaults from ``environ`` (also a parent of ``metrics-dashboard``'s)."""
    parser = argparse.ArgumentParser(prog="streamlit run app.py --", add_help=False)
    parser.add_argument(
        "--runs",
        type=runs_root,
        default=runs_root(environ.get("METRICS_RUNS_DIR", "runs")),
        help="the runs root: every directory under it holding a metrics.jsonl is a run; "
        "s3://bucket/prefix, gs://… or az://container/prefix reads a bucket (README)",
    )
    parser.add_argument(
        "--list-interval",
        type=float,
        default=float(environ.get("METRICS_LIST_INTERVAL", str(LIST_INTERVAL_S))),
        help="seconds between listings of a bucket root (its live runs: each refresh)",
    )
    parser.add_argument(
        "--refresh",
        type=float,
        default=float(environ.get("METRICS_REFRESH", str(DEFAULT_REFRESH_S))),
        help="seconds between updates of an open page",
    )
    parser.add_argument(
        "--poll",
        action="store_true",
        default=environ.get("METRICS_POLL") == "1",
        help="poll the files instead of using inotify",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        default=environ.get("METRICS_DEMO") == "1",
        help="while the root holds no run, show a live demo sweep (written in the cache directory)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=default_directory(environ),
        help="where to keep a columnar copy of big runs (never inside the runs root)",
    )
    parser.add_argument(
        "--no-cache", action="store_true", default=environ.get("METRICS_NO_CACHE") == "1", help="keep no such copy"
    )
    parser.add_argument(
        "--webhook",
        help=f"URL to POST alerts to, as `python -m metrics_core alerts` does; else ${WEBHOOK_VARIABLE}, "
        "which keeps it off the command line every user of the machine can read",
    )
    alerts_config = environ.get("METRICS_ALERTS_CONFIG")
    parser.add_argument(
        "--alerts-config",
        type=Path,
        default=Path(alerts_config) if alerts_config else None,
        help="a TOML file of alert rules (README, 'Alerts')",
    )
    return parser


def parse_settings(argv: list[str], environ: Mapping[str, str]) -> Settings:
    """``--runs DIR`` (else ``$METRICS_RUNS_DIR``, else ``./runs``), ``--refresh S``, ``--poll``,
    ``--demo``, ``--cache-dir DIR`` / ``--no-cache``, ``--webhook URL``, ``--alerts-config FILE`` (the
    settings of ``python -m metrics_core alerts``); unknown arguments are left to Streamlit."""
    args, _ = settings_parser(environ).parse_known_args(argv)
    for flag, value in (("--refresh", args.refresh), ("--list-interval", args.list_interval)):
        if value <= 0:
            raise SystemExit(f"{flag} must be a positive number of seconds, got {value}")
    cache = None if args.no_cache else args.cache_dir
    local = isinstance(args.runs, Path)
    if cache is not None and local and cache.resolve().is_relative_to(args.runs.resolve()):
        raise SystemExit(f"--cache-dir {cache} is inside the runs root {args.runs}: the cache must live elsewhere")
    return Settings(
        runs=args.runs,
        refresh=args.refresh,
        poll=args.poll,
        demo=args.demo,
        cache=cache,
        webhook=args.webhook or environ.get(WEBHOOK_VARIABLE) or None,
        alerts_config=args.alerts_config,
        list_interval=args.list_interval,
        webhook_warning=command_line_warning(args.webhook) if args.webhook else None,
    )


def settings() -> Settings:
    """This server's settings, as the pages show them (``shown``); every page calls it first."""
    return shown(parse_settings(sys.argv[1:], dict(os.environ)))


_DEMO = {"asked": False}  # the empty runs page's button: the demo, as ``--demo`` gives it
_DEMOS: dict[Path, subprocess.Popen] = {}  # the demo supervisor this process started, by its root
_ROOTS_WITH_RUNS: set[Path] = set()  # user roots found holding a run: no demo for them again
_DEMO_LOCK = threading.Lock()  # every tab's script thread may start or stop it


def shown(server: Settings) -> Settings:
    """``server`` as the pages show it: with the demo on (``--demo``, or asked for on the empty runs
    page) and no run under the user's root yet, the runs are the demo's (``demo_root``, never in
    the user's root) and ``demo_of`` is the user's root.  The first run written there ends the
    demo: its trainers stop and the pages show the user's runs from then on."""
    if not (server.demo or _DEMO["asked"]) or not isinstance(server.runs, Path) or server.runs in _ROOTS_WITH_RUNS:
        return server
    if server.runs.is_dir() and find_runs(server.runs):
        with _DEMO_LOCK:
            _ROOTS_WITH_RUNS.add(server.runs)
            while _DEMOS:
                _DEMOS.popitem()[1].terminate()  # SIGTERM: the live run ends its session as interrupted
        return server
    return replace(server, runs=demo_root(server.cache), demo_of=server.runs)


@st.cache_resource(show_spinner=False)
def demo_root(cache: Path | None) -> Path:
    """Where this server's demo writes its runs, never the user's runs root: a new directory of its
    own (0700, made by ``mkdtemp``, so two servers sharing a cache never meet) in the dashboard's
    cache directory, else in the system's temporary directory; removed when the server exits."""
    if cache is not None:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="demo-runs-", dir=cache))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def ask_for_demo() -> None:
    """The empty runs page's button: show the demo from now on, as ``--demo`` would."""
    _DEMO["asked"] = True


_OPEN_STORES: list[RunStore] = []  # every store this process made, until close_server()
_OPEN_ALERTERS: list[ServerAlerter] = []  # every alerter this process started, until close_server()


@st.cache_resource(show_spinner=False)
def _store(runs: Path | str, poll: bool, cache: Path | None, refresh: float, list_interval: float) -> RunStore:
    # A run a page shows is viewed once per refresh: it must read as recently viewed between two.
    recent_s = max(RECENT_S, 4 * refresh)
    # A bucket's live run costs a HEAD per look: looked at no more than once per page refresh.
    polling = {"safety_interval": refresh} if is_bucket_url(runs) else {}
    settings = StoreSettings(
        force_polling=poll,
        cache=None if cache is None else CachePolicy(cache),
        recent_s=recent_s,
        list_interval=list_interval,
        warm=view_findings,  # the run and sessions pages show its health: computed beside their charts
        **polling,
    )
    return_large_frees_at_once()
    store = RunStore(runs, settings)
    _OPEN_STORES.append(store)
    return store


def close_server() -> None:
    """Stop every alerter and close every run store this process made; a store's readers save what
    they parsed since their last cache write.  app.py's lifespan calls it as the server stops: under
    uvicorn, SIGTERM and Ctrl-C end the process by raising the signal again after the shutdown, so
    atexit never runs.  Not tied to ``st.cache_resource``'s release: any browser may ask Streamlit
    to clear its caches, and that must not close a store or stop an alerter other tabs still read."""
    for alerter in _OPEN_ALERTERS:
        alerter.stop()
    while _OPEN_ALERTERS:
        _OPEN_ALERTERS.pop().close()
    while _OPEN_STORES:
        _OPEN_STORES.pop().close()


def open_store(server: Settings) -> RunStore:
    """The one RunStore of this server process (shared by every browser tab and the server's own
    routes); ``MetricsError`` when the runs root is missing (nothing is created unless ``--demo``
    asked for it)."""
    return _store(server.runs, server.poll, server.cache, server.refresh, server.list_interval)


def get_store(server: Settings) -> RunStore:
    """``open_store`` for a page: a clear error on the page when the runs root is missing."""
    try:
        return open_store(server)
    except MetricsError as exc:
        st.error(md_text(exc))
        st.stop()
        raise  # unreachable: st.stop() ends the script


@st.cache_resource(show_spinner=False)
def _alerter(
    runs: Path, webhook: str | None, alerts_config: Path | None, webhook_warning: str | None, _store: RunStore
) -> ServerAlerter:
    # ``runs`` keys the cache; the store (not hashed) is the one of the same root, read through
    alerter = ServerAlerter(_store, load_config(alerts_config) if alerts_config else AlertConfig(), webhook=webhook)
    if webhook_warning is not None:
        logging.getLogger(__name__).warning(webhook_warning)  # once per server: the alerter is made once
    _OPEN_ALERTERS.append(alerter)
    return alerter


def open_alerter(server: Settings) -> ServerAlerter | None:
    """The one alerter of this server process on its runs root, shared by every browser tab and the
    server's own routes, reading the runs through the server's store (``open_store``); None when
    the root is a bucket (alerts read a local root); ``MetricsError`` when ``--alerts-config`` or
    ``--webhook`` cannot be used, or the runs root is missing."""
    if is_bucket_url(server.runs):
        return None
    return _alerter(server.runs, server.webhook, server.alerts_config, server.webhook_warning, open_store(server))


def get_alerter(server: Settings) -> ServerAlerter | None:
    """``open_alerter`` for a page: None, after saying why on the page, when alerts are off (the rest
    of the page works)."""
    if is_bucket_url(server.runs) and (server.webhook or server.alerts_config):
        st.error(md_text(f"Alerts are off: they read a local runs root, not {server.runs}"))
    try:
        return open_alerter(server)
    except MetricsError as exc:
        st.error(md_text(f"Alerts are off: {exc}"))
        return None


def maybe_start_demo(server: Settings) -> None:
    """While the pages show the demo (``shown``), its supervisor runs, started once per server
    process; it dies with the server.  The user's root is made, for their first run."""
    if server.demo_of is None:
        return
    with _DEMO_LOCK:
        if server.runs in _DEMOS or server.demo_of in _ROOTS_WITH_RUNS:
            return
        server.demo_of.mkdir(parents=True, exist_ok=True)
        process = _DEMOS[server.runs] = start_demo(server.runs)
    atexit.register(process.terminate)
