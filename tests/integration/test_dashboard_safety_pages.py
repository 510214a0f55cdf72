"""One run never takes a page down, and untrusted text stays text, on pages run in-process by
AppTest and in what the OS refuses to list (the pure half is in tests/unit/test_dashboard_safety.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from metrics_core.dashboard.display_text import (
    md_text,
    shorten,
)
from tests.support import REPO, append_records, base_record, open_page, popovers, without_permission_override
from tests.support.dashboard import HOSTILE_NAMES, make_runs

RUNS_PAGE_SCRIPT = """
import json, sys
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
store = RunStore(sys.argv[1], StoreSettings(safety_interval=0.0))
try:
    rows = store.runs_table()
    print(json.dumps({row.run: [row.status, row.error] for row in rows.itertuples()}))
finally:
    store.close()
"""


def test_what_the_os_refuses_is_named_relative_to_the_root(tmp_path: Path) -> None:
    """Seen by a server the file modes bind: a directory it may not list is an 'unreadable' row, a
    metrics file it may not read an 'error' row whose reason names the file relative to the root."""
    make_runs(tmp_path, "alpha", "locked-dir/inner", "locked-file")
    (tmp_path / "locked-dir").chmod(0)
    (tmp_path / "locked-file" / "metrics.jsonl").chmod(0)
    try:
        done = subprocess.run([*without_permission_override(), sys.executable, "-c", RUNS_PAGE_SCRIPT, str(tmp_path)],
                              capture_output=True, text=True, timeout=120, cwd=REPO)  # fmt: skip
    finally:
        (tmp_path / "locked-dir").chmod(0o755)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert rows.pop("alpha")[0] != "error"
    assert rows == {
        "locked-dir": ["unreadable", "permission denied"],
        "locked-file": ["error", "locked-file/metrics.jsonl: cannot be opened: Permission denied"],
    }


def test_overview_page_shows_the_error_row_and_the_other_runs(runs_root: Path, poisoned: dict) -> None:
    """The runs page survives a failing run: every run is a row, the failing one says why."""
    make_runs(runs_root, "alpha", "poisoned")
    app = open_page("runs")
    assert not app.exception
    table = app.dataframe[0].value.set_index("run")
    assert list(table.index) == ["run?run=alpha", "run?run=poisoned"]
    assert list(table.loc["run?run=poisoned", "status"]) == ["! error"]
    assert "OverflowError" in table.loc["run?run=poisoned", "error"]


@pytest.mark.parametrize("page", ["run", "sessions"])
def test_a_failing_run_page_names_the_run_and_the_cause(runs_root: Path, poisoned: dict, page: str) -> None:
    """The run's own pages show one plain error naming run and cause; no exception, no title."""
    make_runs(runs_root, "poisoned")
    app = open_page(page, run="poisoned")
    assert not app.exception
    message = app.error[0].value
    assert "poisoned" in message and "OverflowError" in message and "Traceback" not in message
    assert not app.title


def test_hostile_names_reach_markdown_only_escaped(runs_root: Path) -> None:
    """Run titles and names from the URL are escaped markdown; the sessions table names a hostile
    session S1, never by its id."""
    name = "[x](https:__evil.example)"  # '/' would make a nested run directory
    append_records(runs_root / name / "metrics.jsonl",
                   *(base_record(s, session="[Log in again](https://evil.example/login)", train_loss=1.0)
                     for s in (10, 20)))  # fmt: skip
    app = open_page("run", run=name)
    assert not app.exception
    assert app.title[0].value == md_text(name)
    app = open_page("sessions", run=name)
    assert not app.exception
    table = app.dataframe[0].value  # the session by name: its id is in the CSV, never in markdown
    assert table["session"].tolist() == ["S1"] and "[Log in again]" not in "".join(map(str, table.to_numpy().ravel()))
    app = open_page("compare", run=["**y**", name])
    assert not app.exception
    assert md_text("'**y**'") in app.warning[0].value
    app = open_page("run", run="**bold**")
    assert not app.exception and md_text("'**bold**'") in app.error[0].value


def test_the_runs_page_lists_the_runs_beside_a_symlink_loop(runs_root: Path) -> None:
    """A symlink loop in the root is a row naming it and why, first; the runs are rows, no page-wide error."""
    make_runs(runs_root, "alpha", "beta")
    (runs_root / "loop").symlink_to("loop")
    app = open_page("runs")
    assert not app.exception and not app.error
    table = app.dataframe[0].value
    assert table["run"].tolist()[0] == "run?run=loop" and sorted(table["run"][1:]) == ["run?run=alpha", "run?run=beta"]
    assert list(table["status"][0]) == ["⊘ unreadable"] and table["error"][0] == "symlink loop"


@pytest.mark.parametrize(("name", "reason"), [("missing", "no run there (no metrics.jsonl under missing)"),
                                               ("loop/x", "leads outside the runs root, or nowhere")])  # fmt: skip
def test_a_run_page_error_names_no_server_path(runs_root: Path, name: str, reason: str) -> None:
    """A run that is not there, or leads nowhere, is refused with its name and the reason, not the server's path."""
    (runs_root / "loop").symlink_to("loop")
    app = open_page("run", run=name)
    assert not app.exception
    message = app.error[0].value
    assert md_text(reason) in message and str(runs_root) not in re.sub(r"\\(.)", r"\1", message)


def test_a_too_long_run_name_in_the_url_is_a_plain_error(runs_root: Path) -> None:
    """A name the OS refuses (ENAMETOOLONG) is an error message, shortened, not a crash."""
    app = open_page("run", run="n" * 10_000)
    assert not app.exception
    assert "Cannot show run" in app.error[0].value and len(app.error[0].value) < 1000


def test_hostile_config_keys_and_values_stay_text_on_every_page(runs_root: Path) -> None:
    """Config keys, values and a session id from the file reach the page only as dataframe cells or escaped."""
    evil_session = "[Log in again](https://evil.example/login)"
    config = {h: h for h in HOSTILE_NAMES} | {"nested": {"**k**": ["<b>x</b>"]}}
    for name in ("a", "b"):
        append_records(runs_root / name / "metrics.jsonl", base_record(10, session=evil_session, train_loss=1.0),
                       base_record(10, event="config", session=evil_session,
                                   config={**config, "n": name}))  # fmt: skip
    app = open_page("run", run="a")
    assert not app.exception
    (panel,) = popovers(app, "Config")
    table = panel.dataframe[0].value
    assert dict(zip(table["key"], table["value"], strict=True))["nested.**k**"] == '["<b>x</b>"]'
    assert set(HOSTILE_NAMES) - {"# heading\n- item\r\n> quote"} <= set(table["key"])  # cells: text kept as written
    markdown = [e.value for e in (*app.caption, *app.markdown)] + [p.proto.popover.label for p in app.get("popover")]
    assert md_text(repr(shorten(evil_session, 40))) in " ".join(markdown)
    assert not any("](https://evil" in text or "<img" in text or "**k**" in text for text in markdown)
    app = open_page("compare", run=["a", "b"])
    assert not app.exception and app.dataframe[0].value.index.tolist() == ["n"]
    app = open_page("runs")
    app.multiselect(key="config_columns").set_value(["<img src=x onerror=alert(1)>"]).run()
    assert not app.exception
    assert app.dataframe[0].value["<img src=x onerror=alert(1)>"].tolist() == ["<img src=x onerror=alert(1)>"] * 2
