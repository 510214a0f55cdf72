"""One run never takes a page down, and untrusted text stays text: pure helpers and the store (the
pages, run by AppTest, are in tests/integration/test_dashboard_safety_pages.py)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from metrics_core.dashboard.display_text import (
    ELLIPSIS,
    csv_frame,
    file_stem,
    md_text,
    plotly_text,
    shorten,
    shorten_words,
    under_root,
)
from metrics_core.dashboard.figures.layout import Highlight
from metrics_core.dashboard.figures.metric_figures import metric_figure
from metrics_core.dashboard.store import root_listing
from metrics_core.dashboard.store.run_store import RunStore, RunViewError
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views.chart_csv import chart_csv_pieces_of
from metrics_core.dashboard.views.chart_specs import ChartOptions, Series
from metrics_core.dashboard.views.runs_table import newest_first, run_link, run_links
from metrics_core.dashboard.widgets import table_text
from metrics_core.text import csv_cell
from tests.support import APP, append_records, base_record
from tests.support.dashboard import HOSTILE_NAMES, make_runs

PUNCTUATION = re.compile(r"[!-/:-@\[-`{-~]")


# -- pure helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", HOSTILE_NAMES)
def test_md_text_escapes_every_punctuation_mark_and_removes_line_breaks(text: str) -> None:
    """Every ASCII punctuation mark is backslash-escaped (so nothing can form markup) and no line breaks."""
    escaped = md_text(text)
    assert "\n" not in escaped and "\r" not in escaped
    unescaped = re.sub(r"\\(.)", r"\1", escaped).replace("\u2060", "")
    assert unescaped == re.sub(r"[\r\n]", " ", text)  # removing the escapes gives the text back
    assert not re.search(r"(?<!\\)" + PUNCTUATION.pattern, re.sub(r"\\.", "", escaped))


def test_md_text_leaves_plain_words_alone() -> None:
    """Letters, digits, spaces and non-ASCII text are not touched."""
    assert md_text("run 42 Δloss → ok") == "run 42 Δloss → ok"


@pytest.mark.parametrize("text", ["https://evil.example/login", "WWW.evil.example", "a@evil.example", "ftp://x"])
def test_md_text_breaks_the_shapes_gfm_autolinks(text: str) -> None:
    """GFM autolink literals see through escapes: an invisible word joiner breaks ://, www. and @."""
    shown = re.sub(r"\\(.)", r"\1", md_text(text))
    assert "\u2060" in shown and shown.replace("\u2060", "") == text
    assert not re.search(r"://|www\.|@[\w-]", shown, re.IGNORECASE)


@pytest.mark.parametrize("text", HOSTILE_NAMES)
def test_plotly_text_cannot_form_a_tag(text: str) -> None:
    """No '<' or '>' survive, '&' cannot start an entity, and decoding gives the text back."""
    escaped = plotly_text(text)
    assert "<" not in escaped and ">" not in escaped and "\n" not in escaped
    assert re.fullmatch(r"([^&]|&(amp|lt|gt);)*", escaped)
    decoded = escaped.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    assert decoded == re.sub(r"[\r\n]", " ", text)


def test_shorten_cuts_long_text_with_an_ellipsis() -> None:
    """Short text is unchanged; long text keeps its start, ends with an ellipsis and fits the limit."""
    assert shorten("short", 80) == "short"
    long = shorten("x" * 10_000, 80)
    assert len(long) == 80 and long.endswith(ELLIPSIS) and long.startswith("x" * 79)


def test_shorten_words_keeps_the_sentence_and_cuts_the_long_token() -> None:
    """A 10k-character id inside a message is cut; the words after it survive."""
    message = f"session {'s' * 10_000}, steps 10–20: 2 window(s) bad"
    short = shorten_words(message)
    assert short.endswith("steps 10–20: 2 window(s) bad")
    assert max(len(word) for word in short.split()) <= 60 + 1 and ELLIPSIS in short


@pytest.mark.parametrize("name", [*HOSTILE_NAMES, "a b?c=d&run=e#f", "100%", "../../etc", "x" * 300])
def test_run_link_quotes_everything_but_a_readable_path(name: str) -> None:
    """A run link is always a relative URL with a single run= parameter: no scheme, no markdown, no HTML."""
    link = run_link(name)
    assert re.fullmatch(r"run\?run=[A-Za-z0-9_.~/%-]*", link)
    assert run_link("group/beta") == "run?run=group/beta"


def test_file_stem_is_a_safe_file_name() -> None:
    """Download names hold only safe characters and stay short."""
    assert file_stem("group/beta") == "group_beta"
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,100}", file_stem("<img src=x>" * 100))
    assert file_stem("../..") == "run"


def test_table_text_escapes_string_cells_only() -> None:
    """st.table renders cells as markdown: strings are escaped and shortened, numbers are untouched."""
    table = pd.DataFrame({"id": ["[Log in again](https://evil.example/login)", "s" * 10_000], "records": [3, 4]})
    shown = table_text(table)
    assert shown["id"][0] == md_text("[Log in again](https://evil.example/login)")
    assert len(shown["id"][1]) <= 60 and shown["id"][1].endswith(ELLIPSIS)
    assert shown["records"].tolist() == [3, 4]


def test_overview_links_and_error_reasons_are_shortened() -> None:
    """The runs table shown: run column as links, a long error reason cut."""
    table = pd.DataFrame({"run": ["a"], "error": ["x" * 5000]})
    shown = run_links(table)
    assert shown["run"][0] == "run?run=a"
    assert len(shown["error"][0]) <= 120


def test_under_root_says_paths_inside_the_root_relative_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path inside the root, spelled as given, absolute or through a link, reads as a run-relative
    path; the root itself, and paths that only look alike, are left as they are."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    root = tmp_path / "link"
    text = (f"[Errno 13] Permission denied: '{root}/a/metrics.jsonl'; {real}/b/c: gone; {tmp_path}/other/x; "
            f"/old{real}/d; {real}x/e; {root}: the root")  # fmt: skip
    assert under_root(text, root) == (
        f"[Errno 13] Permission denied: 'a/metrics.jsonl'; b/c: gone; {tmp_path}/other/x; /old{real}/d; {real}x/e; "
        f"{root}: the root"
    )
    monkeypatch.chdir(tmp_path)
    assert under_root("link/a/metrics.jsonl: no such file (under link/a)", Path("link")) == (
        "a/metrics.jsonl: no such file (under a)"
    )


def test_unreadable_entries_lead_the_runs_table() -> None:
    """An entry that hides runs is on the first page of a big root, whatever the runs' ages."""
    table = pd.DataFrame({"run": ["old", "bad", "new", "cold"], "status": ["finished", "unreadable", "live", "loading"],
                          "last record age (s)": [500.0, None, 5.0, None]})  # fmt: skip
    assert newest_first(table)["run"].tolist() == ["bad", "new", "old", "cold"]


def test_runs_of_the_same_age_keep_their_rows_whatever_order_the_store_read_them_in() -> None:
    """Runs whose last records are as old go by name, so the page does not change when the store's
    rows come in another order (after a run off the page was read again)."""
    ages = [60.0, 60.0, 60.0, 5.0]
    table = pd.DataFrame({"run": ["b", "c", "a", "z"], "status": ["finished"] * 4, "last record age (s)": ages})
    orders = {tuple(newest_first(table.sample(frac=1, random_state=seed))["run"]) for seed in range(20)}
    assert orders == {("z", "a", "b", "c")}


def test_figure_text_fields_are_escaped_for_plotly() -> None:
    """Trace names, titles and highlight labels carry no HTML a plotly.js label would render."""
    frame = pd.DataFrame({"step": [1, 2], "train_loss": [1.0, 0.5], "session_id": ["s", "s"]})
    frame["session_id"] = frame["session_id"].astype("category")
    name = '<a href="https://evil.example">x</a>' + "y" * 500
    figure = metric_figure(
        [Series(frame, "train_loss", name, colour="#000")],
        title="<b>title</b>",
        sessions=[],
        highlights=[Highlight(1.0, 2.0, "<br>label", "#000")],
    )
    texts = [trace.name for trace in figure.data] + [figure.layout.title.text]
    texts += [annotation.text for annotation in figure.layout.annotations]
    assert all("<" not in text and ">" not in text for text in texts)
    assert figure.data[0].name.startswith("&lt;a href=") and len(figure.data[0].name) < 80
    assert figure.layout.title.text == "&lt;b&gt;title&lt;/b&gt;"


# -- the store contains failures per run ---------------------------------------------------------


def test_overview_lists_every_run_and_a_failing_one_as_an_error_row(tmp_path: Path, poisoned: dict) -> None:
    """One run whose reading raises is a row with status 'error' and the reason; the others are listed."""
    make_runs(tmp_path, "alpha", "poisoned", "zeta")
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        table = store.runs_table()
        assert table["run"].tolist() == ["alpha", "poisoned", "zeta"]
        rows = table.set_index("run")
        assert rows.loc["poisoned", "status"] == "error"
        assert rows.loc["poisoned", "error"] == "OverflowError: Python int too large to convert to C long"
        assert rows.loc["alpha", "status"] != "error" and rows.loc["alpha", "last step"] == 20
        assert pd.isna(rows.loc["zeta", "error"])
        with pytest.raises(RunViewError, match=r"run 'poisoned' cannot be shown: OverflowError"):
            store.view("poisoned")
    finally:
        store.close()


def test_overview_lists_the_runs_beside_entries_it_cannot_look_into(tmp_path: Path) -> None:
    """A symlink loop and a link through a file are rows with status 'unreadable' and the reason beside
    every run; once one is gone, the next rediscovery drops its row and moves the generation."""
    make_runs(tmp_path, "alpha", "group/beta")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "group" / "through").symlink_to("beta/metrics.jsonl/x")
    clock = [0.0]
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0, clock=lambda: clock[0]))
    try:
        rows = store.runs_table().set_index("run")
        assert sorted(rows.index) == ["alpha", "group/beta", "group/through", "loop"]
        assert rows.loc[["loop", "group/through"], "status"].tolist() == ["unreadable", "unreadable"]
        assert rows.loc[["loop", "group/through"], "error"].tolist() == ["symlink loop", "not a directory"]
        assert rows.loc["alpha", "last step"] == 20 and rows.loc["group/beta", "last step"] == 20
        before = store.runs_table_generation()
        (tmp_path / "loop").unlink()
        clock[0] += root_listing.REDISCOVER_S
        assert sorted(store.runs_table()["run"]) == ["alpha", "group/beta", "group/through"]
        assert store.runs_table_generation() != before
    finally:
        store.close()


def test_a_failed_run_is_retried_from_scratch_only_once_its_file_changed(tmp_path: Path, poisoned: dict) -> None:
    """A cached failure costs no re-read; after an append the run is re-read from the start and shown."""
    make_runs(tmp_path, "poisoned")
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        for _ in range(3):
            with pytest.raises(RunViewError):
                store.view("poisoned")
        assert poisoned["refresh"] == 1
        poisoned["raise"] = 0
        append_records(tmp_path / "poisoned" / "metrics.jsonl", base_record(30, train_loss=0.1))
        view = store.view("poisoned")
        assert view.records == 3 and view.frames["train"]["step"].tolist() == [10, 20, 30]
        assert store.runs_table()["status"].tolist() != ["error"]
    finally:
        store.close()


def test_a_string_logged_under_a_loss_name_does_not_break_the_overview(tmp_path: Path) -> None:
    """A metric string value where a number was expected is shown as no value, not a crash."""
    append_records(tmp_path / "r" / "metrics.jsonl", base_record(10, train_loss=1.0),
                   base_record(20, train_loss='<a href="https://evil.example">x</a>'))  # fmt: skip
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        row = store.runs_table().iloc[0]
        assert row["status"] != "error" and row["train loss"] == 1.0
    finally:
        store.close()


def test_a_string_among_loss_values_is_a_gap_in_the_view_not_a_failure(tmp_path: Path) -> None:
    """A field whose type changed (a string under train_loss once) is numeric in the view, the string a NaN."""
    append_records(tmp_path / "r" / "metrics.jsonl", base_record(10, train_loss=1.0),
                   base_record(20, train_loss="<b>oops</b>"), base_record(30, train_loss=0.5))  # fmt: skip
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        loss = store.view("r").frames["train"]["train_loss"]
        assert loss.dtype == np.float64 and loss.isna().tolist() == [False, True, False]
    finally:
        store.close()


def test_diagnostics_that_raise_become_a_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the advisory checks is one error finding with the cause, not a page that fails."""
    from metrics_core.dashboard.views import memo as live_views

    append_records(tmp_path / "r" / "metrics.jsonl", base_record(10, train_loss=1.0))
    monkeypatch.setattr(live_views, "diagnose", lambda **_: 1 / 0)
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        [finding] = live_views.view_findings(store.view("r"))
        assert finding.severity == "error" and "ZeroDivisionError" in finding.message
    finally:
        store.close()


# -- pages under AppTest -----------------------------------------------------------------------


def test_the_server_shows_no_error_details_in_the_browser() -> None:
    """.streamlit/config.toml hides uncaught exceptions' tracebacks and messages, with a value 1.67 accepts."""
    import tomllib
    from streamlit.config import ShowErrorDetailsConfigOptions

    config = tomllib.loads((Path(APP).parent / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert config["client"]["showErrorDetails"] == ShowErrorDetailsConfigOptions.NONE.value


@pytest.mark.parametrize(
    ("cell", "written"),
    [('=HYPERLINK("http://evil.example","x")', '\'=HYPERLINK("http://evil.example","x")'),
     ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"), ("-2+3", "'-2+3"), ("@SUM(A1)", "'@SUM(A1)"),
     ("\t=1", "'\t=1"), ("-inf", "'-inf"), ("-1.5", "-1.5"), ("+2e-3", "+2e-3"), ("-7", "-7"),
     ("run-1", "run-1"), ("", "")],
)  # fmt: skip
def test_a_csv_cell_that_starts_like_a_formula_is_text_and_a_number_stays_a_number(cell: str, written: str) -> None:
    """OWASP's formula starts get a leading ' unless the cell is a plain number."""
    assert csv_cell(cell) == written


def test_a_charts_csv_keeps_another_users_formulas_as_text(tmp_path: Path) -> None:
    """A session id and a key that are spreadsheet formulas: the chart's CSV writes them after a ',
    its negative values as numbers; a frame with nothing to change is sent as it is."""
    formula = '=HYPERLINK("http://evil.example","x")'
    records = (base_record(step, session=formula, train_loss=-1.5, **{"@key": -2.5}) for step in (1, 2))
    append_records(tmp_path / "r" / "metrics.jsonl", *records)
    store = RunStore(tmp_path)
    try:
        view = store.view("r")
        pieces = {key: "".join(chart_csv_pieces_of(view, ChartOptions(), key)) for key in ("loss", "key:@key")}
    finally:
        store.close()
    for key, text in pieces.items():
        header, *rows = csv.reader(io.StringIO(text))
        cells = [dict(zip(header, row, strict=True)) for row in rows]
        assert len(cells) == 2 and all(cell["session_id"] == "'" + formula for cell in cells), key
        assert {cell["value"] for cell in cells} == {"-1.5" if key == "loss" else "-2.5"}
    assert {cell for row in csv.reader(io.StringIO(pieces["key:@key"])) for cell in row} >= {"'@key"}
    plain = pd.DataFrame({"run": ["a", "b"], "value": [-1.5, 2.0]})
    assert csv_frame(plain) is plain


def test_the_sql_boxs_csv_keeps_formulas_as_text() -> None:
    """The SQL box's download: a text cell and a column name that are formulas written after a ',
    a negative number a number."""
    import pyarrow as pa

    from metrics_core.dashboard.sql_box import answer_csv

    table = pa.table({"=cmd": ['=HYPERLINK("http://evil.example")', "run"], "loss": [-1.5, 2.0]})
    assert list(csv.reader(io.StringIO(answer_csv(table)))) == [
        ["'=cmd", "loss"],
        ['\'=HYPERLINK("http://evil.example")', "-1.5"],
        ["run", "2.0"],
    ]
