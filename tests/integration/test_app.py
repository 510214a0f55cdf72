"""Every page under streamlit.testing.v1.AppTest: widgets found by key, good and bad query params."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from metrics_core.dashboard.demo import SWEEP
from metrics_core.dashboard.display_text import md_text
from metrics_core.dashboard.figures.layout import SESSION_COLOURS
from metrics_core.roots.discovery import find_runs
from tests.support import APP, append_records, base_record, distributed_run, open_page, popovers, three_session_run


def make_run(root: Path, name: str, sessions: int = 1) -> None:
    for index in range(sessions):
        start = index * 50
        windows = [
            base_record(step, session=f"s{index}", train_loss=5.0 / (step + 1), tokens=100,
                        grad_norm_avg=None if step % 30 == 0 else 1.0)
            for step in range(start + 10, start + 101, 10)
        ]  # fmt: skip
        start_record = base_record(start, event="session_start", session=f"s{index}", discarded_bytes=0)
        append_records(root / name / "metrics.jsonl", start_record, *windows)


def shown(markdown: str) -> str:
    """What a reader sees of escaped markdown (untrusted text is backslash-escaped)."""
    return re.sub(r"\\(.)", r"\1", markdown)


def test_overview_of_an_empty_root_offers_the_demo(runs_root: Path) -> None:
    """No runs: the page says so and offers the live demo button."""
    app = open_page("runs")
    assert not app.exception
    assert "No runs" in app.info[0].value
    assert app.button(key="start_demo")


def test_the_demo_is_a_sweep_kept_outside_the_runs_root_until_the_users_first_run(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``--demo`` and an empty root, the runs page lists the demo's four runs, written in the
    dashboard's cache directory, and says so; nothing is written in the user's root; the user's
    first run ends the demo: its trainers stop and the page lists that run alone."""
    monkeypatch.setenv("METRICS_DEMO", "1")
    monkeypatch.setenv("METRICS_CACHE_DIR", str(tmp_path / "cache"))
    app = open_page("runs")
    assert not app.exception and "A demo" in app.info[0].value

    def listed() -> list[str]:
        app.run()
        return sorted(app.dataframe[0].value["run"]) if app.dataframe else []

    deadline = time.monotonic() + 120
    while len(listed()) < len(SWEEP) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert listed() == [f"run?run={name}" for name in sorted(SWEEP)]
    (demo,) = (tmp_path / "cache").glob("demo-runs-*")
    assert [run.name for run in find_runs(demo)] == sorted(SWEEP) and demo.stat().st_mode & 0o777 == 0o700
    assert list(runs_root.iterdir()) == []
    make_run(runs_root, "mine")
    assert listed() == ["run?run=mine"] and not any("A demo" in info.value for info in app.info)
    deadline = time.monotonic() + 30
    while demo_processes(demo) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert demo_processes(demo) == []


def demo_processes(under: Path) -> list[int]:
    """The demo's processes (supervisor and trainers) writing under ``under``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode() if entry.name.isdigit() else ""
        except OSError:
            continue
        if "metrics_core.dashboard.demo" in command and str(under) in command:
            found.append(int(entry.name))
    return found


def test_overview_lists_runs_and_filters_by_regex(runs_root: Path) -> None:
    """Every run is a row; the regex filter narrows it; a bad regex is an error, not a crash."""
    make_run(runs_root, "alpha")
    make_run(runs_root, "group/beta")
    app = open_page("runs")
    assert not app.exception
    table = app.dataframe[0].value
    assert sorted(table["run"]) == ["run?run=alpha", "run?run=group/beta"]
    assert set(table.columns) >= {"status", "sessions", "last step", "train loss", "bad lines"}
    app.text_input(key="run_filter").input("^gr").run()
    assert list(app.dataframe[0].value["run"]) == ["run?run=group/beta"]
    app.text_input(key="run_filter").input("ALPHA|^group/*a$").run()  # a name filter: no regular expression
    assert sorted(app.dataframe[0].value["run"]) == ["run?run=alpha", "run?run=group/beta"]
    app.text_input(key="run_filter").input("(.|.|.|.)*!").run()  # stalled the server as a regular expression
    assert not app.error and len(app.dataframe[0].value) == 0


def test_why_a_run_stopped_is_on_the_overview_the_run_page_and_the_sessions_table(runs_root: Path) -> None:
    """A session that ended failed on another rank's exception, then a resumed one that was
    interrupted: the runs page's error column, the run page (a warning above the charts) and each
    session's row say why, as text."""
    path = runs_root / "stopped" / "metrics.jsonl"
    append_records(path, base_record(10, session="s1", train_loss=1.0),
                   base_record(10, event="session_end", session="s1", status="failed",
                               error="rank 2: ValueError: **boom** at window 3"),
                   base_record(10, session="s2", train_loss=0.9),
                   base_record(20, event="session_end", session="s2", status="interrupted",
                               error="SIGTERM"))  # fmt: skip
    app = open_page("runs")
    assert not app.exception
    assert app.dataframe[0].value.set_index("run").loc["run?run=stopped", "error"] == "SIGTERM"
    app = open_page("run", run="stopped")
    assert not app.exception and [w.value for w in app.warning] == [md_text("Interrupted: SIGTERM")]
    app = open_page("sessions", run="stopped")
    assert not app.exception
    assert list(app.dataframe[0].value["reason"]) == ["rank 2: ValueError: **boom** at window 3", "SIGTERM"]


def test_run_page_shows_the_controls_and_status(runs_root: Path) -> None:
    """A real run: title, status caption and every control, found by key."""
    make_run(runs_root, "alpha", sessions=2)
    app = open_page("run", run="alpha")
    assert not app.exception
    assert app.title[0].value == "alpha"
    assert "2 session(s)" in app.caption[0].value
    for key in ("x_axis", "smoothing", "log_y", "history", "pause"):
        assert app.session_state[key] is not None
    app.selectbox(key="x_axis").select("tokens_seen").run()
    app.radio(key="history").set_value("all").run()
    app.toggle(key="pause").set_value(True).run()
    assert not app.exception


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ("missing", "no run there"),
        ("../outside", "without '..'"),
        ("/etc", "relative"),
        ("link", "outside"),
    ],
)
def test_run_page_refuses_bad_run_parameters(runs_root: Path, tmp_path: Path, run: str, message: str) -> None:
    """Unknown runs and paths escaping the root get a clear message and read nothing."""
    make_run(tmp_path / "outside_root", "secret")
    (runs_root / "link").symlink_to(tmp_path / "outside_root" / "secret")
    app = open_page("run", run=run)
    assert not app.exception
    assert message in shown(app.error[0].value)
    assert not app.title


def test_sessions_page_table_and_lost_work(runs_root: Path) -> None:
    """Three sessions: one table row each (named S1…S3 in their chart colours, durations as
    h:mm:ss, every column explained), the lost-work metrics, and any chart overlaid by session."""
    three_session_run(runs_root / "resumed" / "metrics.jsonl")
    app = open_page("sessions", run="resumed")
    assert not app.exception
    grid = app.dataframe[0]
    table = grid.value
    assert list(table["session"]) == ["S1", "S2", "S3"] and list(table["replayed"]) == [0, 40, 30]
    columns = json.loads(grid.proto.columns)
    assert columns["replayed"]["help"] and list(table["tokens/s"]) == ["100", "100", "100"]
    assert list(table["replayed tokens"]) == ["0", "4.0k", "3.0k"]
    assert list(table["resume step"]) == ["—", "60", "120"] and list(table["steps"])[1] == "60–150"
    assert not table.isna().any().any() and not table.isin(["None", "nan", "NaN", "<NA>"]).any().any()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", table["start"][0]) and re.fullmatch(
        r"[\d:]{8}", table["end"][0]
    )
    assert "color: " + SESSION_COLOURS[1] in grid.proto.arrow_data.styler.styles
    metrics = {metric.label: metric.value for metric in app.metric}
    assert metrics["Steps replayed"] == "70" and metrics["Tokens replayed"] == "7,000"
    app.segmented_control(key="align").set_value("tokens_seen").run()
    assert not app.exception
    app.selectbox(key="session_chart").set_value("grad_norm").run()
    assert not app.exception and app.selectbox(key="session_chart").value == "grad_norm"


@pytest.mark.parametrize("page", ["sessions", "run"])
@pytest.mark.parametrize("run", ["../x", "nope"])
def test_sessions_and_run_pages_refuse_bad_runs(runs_root: Path, page: str, run: str) -> None:
    """Bad run parameters never reach a reader on either page."""
    app = open_page(page, run=run)
    assert not app.exception and "Cannot show run" in app.error[0].value


def test_compare_page_reads_and_writes_the_url(runs_root: Path) -> None:
    """run= parameters preselect runs, unknown ones are named, and picking updates the URL."""
    make_run(runs_root, "alpha")
    make_run(runs_root, "group/beta")
    app = AppTest.from_file(APP, default_timeout=30)
    app.query_params["run"] = ["alpha", "ghost"]
    app.run()
    app.switch_page("pages/compare.py").run()
    assert not app.exception
    assert "ghost" in app.warning[0].value
    assert app.multiselect(key="compare_runs").value == ["alpha"]
    app.multiselect(key="compare_runs").set_value(["alpha", "group/beta"]).run()
    assert app.query_params["run"] == ["alpha", "group/beta"]
    assert app.multiselect(key="compare_metrics").value == ["train_loss", "val_loss", "grad_norm_avg", "lr",
                                                            "tokens_per_s"]  # fmt: skip
    app.multiselect(key="compare_metrics").set_value(["val_loss", "skipped_updates"]).run()
    app.text_input(key="compare_filter").input("^gr").run()
    assert not app.exception


def test_missing_runs_root_is_a_clear_error_and_nothing_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mistyped --runs is named on the page; no directory appears out of nowhere."""
    monkeypatch.setenv("METRICS_RUNS_DIR", str(tmp_path / "typo"))
    app = open_page("runs")
    assert not app.exception
    assert "runs root does not exist" in app.error[0].value
    assert not (tmp_path / "typo").exists()


# -- run config and the straggler chart ----------------------------------------------------------


def add_config(root: Path, name: str, config: object, *, session: str = "s0", step: int = 0) -> None:
    append_records(root / name / "metrics.jsonl", base_record(step, event="config", session=session, config=config))


def download_keys(app: AppTest) -> list[str]:
    return [button.key for button in app.get("download_button")]


def test_run_page_shows_the_config_and_what_changed_at_resume(runs_root: Path) -> None:
    """Config button: key → value of the latest session; its label names the LR changed at S2's resume."""
    make_run(runs_root, "alpha", sessions=2)
    add_config(runs_root, "alpha", {"optim": {"lr": 3e-4, "betas": [0.9, 0.95]}, "model": "gpt2"}, session="s0")
    add_config(runs_root, "alpha", {"optim": {"lr": 1e-4, "betas": [0.9, 0.95]}, "model": "gpt2"}, session="s1",
               step=50)  # fmt: skip
    app = open_page("run", run="alpha")
    assert not app.exception
    (panel,) = popovers(app, "Config")
    assert "changed at resume: optim\\.lr" in panel.proto.popover.label  # escaped markdown
    config, changes = (frame.value for frame in panel.dataframe)
    assert dict(zip(config["key"], config["value"], strict=True)) == {
        "optim.lr": "0.0001", "optim.betas": "[0.9, 0.95]", "model": "gpt2"}  # fmt: skip
    assert changes.to_dict("records") == [
        {"session": "S2", "step": 50, "key": "optim.lr", "before": "0.0003", "after": "0.0001"}]  # fmt: skip
    assert "csv_straggler" not in download_keys(app)  # one rank: no straggler chart


def test_run_page_without_config_says_how_to_log_one(runs_root: Path) -> None:
    """No config record: a one-line hint, no config button, no table."""
    make_run(runs_root, "alpha")
    app = open_page("run", run="alpha")
    assert not app.exception
    assert not popovers(app, "Config")
    (hint,) = [caption for caption in app.caption if caption.value == "No config logged"]
    assert "write_config" in hint.proto.help


def test_run_page_of_a_distributed_run_has_the_straggler_chart(runs_root: Path) -> None:
    """world_size > 1: a seventh chart with its CSV button, kept across history modes."""
    distributed_run(runs_root / "dp" / "metrics.jsonl")
    app = open_page("run", run="dp")
    assert not app.exception
    assert "csv_straggler" in download_keys(app) and len(download_keys(app)) == 7
    app.radio(key="history").set_value("sessions").run()
    assert not app.exception and "csv_straggler" in download_keys(app)


def test_overview_config_columns_and_filter(runs_root: Path) -> None:
    """Chosen config keys become columns; key=value terms filter rows; a bad term is an error, not a crash."""
    for name, lr in (("alpha", 3e-4), ("beta", 1e-4)):
        make_run(runs_root, name)
        add_config(runs_root, name, {"optim": {"lr": lr}, "model": "gpt2"})
    make_run(runs_root, "plain")  # no config at all
    app = open_page("runs")
    assert not app.exception
    assert "config" not in app.dataframe[0].value.columns
    assert app.multiselect(key="config_columns").options == ["model", "optim.lr"]
    app.multiselect(key="config_columns").set_value(["optim.lr"]).run()
    table = app.dataframe[0].value.set_index("run")
    assert table.loc[["run?run=alpha", "run?run=beta"], "optim.lr"].tolist() == ["0.0003", "0.0001"]
    assert table.loc["run?run=plain", "optim.lr"] == "—"  # one dash for missing, never None
    app.text_input(key="config_filter").input("optim.lr=3e-4").run()
    assert list(app.dataframe[0].value["run"]) == ["run?run=alpha"]
    app.text_input(key="config_filter").input("model!=gpt2").run()
    assert list(app.dataframe[0].value["run"]) == ["run?run=plain"]
    app.text_input(key="config_filter").input("lr").run()
    assert "not key=value" in shown(app.error[0].value) and len(app.dataframe[0].value) == 3


def test_overview_without_any_config(runs_root: Path) -> None:
    """Runs without configs: no keys to choose, and a config filter term simply matches nothing."""
    make_run(runs_root, "alpha")
    app = open_page("runs")
    assert not app.exception and app.multiselect(key="config_columns").options == []
    app.text_input(key="config_filter").input("lr=1").run()
    assert not app.exception and app.dataframe[0].value.empty


def test_compare_page_shows_the_config_keys_that_differ(runs_root: Path) -> None:
    """Differing keys by run (a missing key is '(not set)'); identical keys behind the toggle."""
    make_run(runs_root, "alpha")
    make_run(runs_root, "beta")
    add_config(runs_root, "alpha", {"optim": {"lr": 3e-4}, "model": "gpt2", "only_alpha": 1})
    add_config(runs_root, "beta", {"optim": {"lr": 1e-4}, "model": "gpt2"})
    app = open_page("compare", run=["alpha", "beta"])
    assert not app.exception
    table = app.dataframe[0].value
    assert list(table.columns) == ["alpha", "beta"]
    assert table.to_dict("index") == {"only_alpha": {"alpha": "1", "beta": "(not set)"},
                                      "optim.lr": {"alpha": "0.0003", "beta": "0.0001"}}  # fmt: skip
    app.toggle(key="config_all").set_value(True).run()
    assert sorted(app.dataframe[0].value.index) == ["model", "only_alpha", "optim.lr"]


def test_compare_page_without_configs(runs_root: Path) -> None:
    """Runs without configs: a plain note instead of a table, no toggle needed."""
    make_run(runs_root, "alpha")
    make_run(runs_root, "beta")
    app = open_page("compare", run=["alpha", "beta"])
    assert not app.exception and not app.dataframe
    assert any("None of these runs logged a config" in caption.value for caption in app.caption)


# -- pages opened from the top bar, and the runs table as people read it --------------------------


@pytest.mark.parametrize("page", ["run", "sessions"])
def test_run_and_sessions_pages_without_a_run_offer_a_picker(runs_root: Path, page: str) -> None:
    """Opened with no ?run=: a picker of the runs instead of an error; choosing one names it in the URL."""
    make_run(runs_root, "alpha", sessions=2)
    make_run(runs_root, "group/beta")
    app = open_page(page)
    assert not app.exception and not app.error
    picker = app.selectbox(key="run_picker")
    assert picker.options == ["alpha", "group/beta"] and picker.value is None
    picker.select("group/beta").run()
    assert not app.exception
    assert app.query_params["run"] == "group/beta"
    assert "group/beta" in shown(app.title[0].value)


def test_run_page_picker_of_an_empty_root_says_so(runs_root: Path) -> None:
    """No runs at all: a plain note, no picker, no error."""
    app = open_page("run")
    assert not app.exception and not app.error
    assert "No runs" in app.info[0].value


def test_overview_reads_at_a_glance(runs_root: Path) -> None:
    """Status badge, a loss trend per run, human numbers, "—" for a missing value, newest first."""
    make_run(runs_root, "older", sessions=1)
    append_records(runs_root / "newer" / "metrics.jsonl",
                   *(base_record(s, train_loss=3.0 - s / 1000, tokens=22_000)
                     for s in range(10, 1001, 10)))  # fmt: skip
    app = open_page("runs")
    assert not app.exception
    table = app.dataframe[0].value
    assert list(table["run"]) == ["run?run=newer", "run?run=older"]
    newer = table.iloc[0]
    assert list(newer["status"]) == ["✕ crashed"]  # no session_end, nothing for long: a badge, then the word
    assert newer["tokens seen"].endswith("k") or newer["tokens seen"].endswith("M")
    assert newer["val loss"] == "—"
    assert len(newer["loss trend"]) == 40 and newer["loss trend"][0] > newer["loss trend"][-1]
    assert {"started", "duration", "last activity"} <= set(table.columns)


def test_sessions_page_shows_durations_as_clock_times(runs_root: Path) -> None:
    """Durations and downtimes read h:mm:ss; the CSV is named after the run."""
    three_session_run(runs_root / "resumed" / "metrics.jsonl")
    app = open_page("sessions", run="resumed")
    assert not app.exception
    table = app.dataframe[0].value
    assert list(table["duration"]) == ["0:01:40", "0:01:30", "0:01:20"]
    assert table["downtime"].iloc[0] == "—"


def test_the_runs_page_knows_when_an_age_it_shows_next_reads_differently() -> None:
    """Seconds until the first "N s/min/h/d ago" text changes; missing ages never do."""
    from metrics_core.dashboard.display_text import age_text, next_age_change

    assert next_age_change([None, float("nan")]) == float("inf")
    assert next_age_change([18.25, 4000.0]) == pytest.approx(0.75)
    assert next_age_change([90.0, 2 * 86_400.0 + 10]) == pytest.approx(30.0)
    for age in (18.25, 59.5, 90.0, 3_599.0, 4_000.0, 86_399.0, 2 * 86_400.0 + 10):
        wait = next_age_change([age])
        assert age_text(age + wait - 1e-6) == age_text(age) != age_text(age + wait + 1e-6)
