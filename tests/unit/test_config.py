"""A run's config as the dashboard shows it, tested without a server: flattening, the latest
record, changes at resume, the diff across runs, the runs-table filter and columns."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.dashboard.store.run_config import MAX_KEYS, ROOT_KEY, flatten_config, run_config
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views.config_tables import (
    NOT_SET,
    changes_table,
    column_names,
    config_diff,
    config_table,
    filter_by_config,
    parse_config_filter,
    runs_table,
    view_config,
    with_config_columns,
)
from tests.support import append_records, base_record, read_run

CONFIG = {"optim": {"lr": 3e-4, "betas": [0.9, 0.95], "sched": {"warmup": 100}}, "model": "gpt2", "fp16": True,
          "seed": None, "tags": {}}  # fmt: skip


def config_record(step: int, session: str, config: object) -> dict:
    return base_record(step, event="config", session=session, config=config)


def test_flatten_gives_dotted_keys_and_json_text_values() -> None:
    """Nested objects become dotted paths; strings stay as written, the rest is compact JSON."""
    flat, dropped = flatten_config(CONFIG)
    assert flat == {
        "optim.lr": "0.0003", "optim.betas": "[0.9, 0.95]", "optim.sched.warmup": "100", "model": "gpt2",
        "fp16": "true", "seed": "null", "tags": "{}",
    }  # fmt: skip
    assert dropped == 0


def test_flatten_keeps_both_values_when_a_dotted_key_collides() -> None:
    """{"a.b": 1, "a": {"b": 2}} loses neither value: the second gets a suffix."""
    flat, _ = flatten_config({"a.b": 1, "a": {"b": 2}})
    assert flat == {"a.b": "1", "a.b #2": "2"}


def test_flatten_of_a_non_object_config_and_a_key_cap() -> None:
    """A scalar or list under ``config`` (a file is not a writer) is one key; a huge config is capped and counted."""
    assert flatten_config(5) == ({ROOT_KEY: "5"}, 0)
    assert flatten_config(["x"]) == ({ROOT_KEY: '["x"]'}, 0)
    assert flatten_config(None) == ({}, 0)
    flat, dropped = flatten_config({f"k{i}": i for i in range(MAX_KEYS + 5)})
    assert len(flat) == MAX_KEYS and dropped == 5


def test_flatten_survives_deep_nesting() -> None:
    """A 5,000-level object (beyond Python's recursion limit) flattens to one long dotted key."""
    tree: dict = {"leaf": 1}
    for _ in range(5000):
        tree = {"n": tree}
    flat, _ = flatten_config(tree)
    assert list(flat.values()) == ["1"] and next(iter(flat)).endswith("n.leaf")


def test_the_latest_sessions_record_is_the_config_and_resume_changes_are_listed(tmp_path: Path) -> None:
    """Two sessions, LR lowered on resume and a key added: the config is S2's, the changes say so."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, base_record(0, event="session_start", session="s1"), config_record(0, "s1", CONFIG),
                   base_record(10, session="s1", train_loss=1.0),
                   base_record(5, event="session_start", session="s2"),
                   config_record(5, "s2", {**CONFIG, "optim": {**CONFIG["optim"], "lr": 1e-4}, "new": 1}))  # fmt: skip
    reader = read_run(path)
    config = run_config(reader.frame("config"), reader.sessions)
    assert (config.session, config.session_id, config.step, config.records) == (1, "s2", 5, 2)
    assert config.values["optim.lr"] == "0.0001" and config.values["new"] == "1"
    assert [(c.session, c.step, c.key, c.before, c.after) for c in config.changes] == [
        (1, 5, "optim.lr", "0.0003", "0.0001"), (1, 5, "new", None, "1")]  # fmt: skip
    table = changes_table(config)
    assert table.to_dict("records")[1] == {"session": "S2", "step": 5, "key": "new", "before": NOT_SET, "after": "1"}


def test_no_change_when_a_resumed_session_logs_the_same_config(tmp_path: Path) -> None:
    """The same config logged by each session is one config and no changes."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, config_record(0, "s1", CONFIG), config_record(10, "s2", CONFIG))
    reader = read_run(path)
    config = run_config(reader.frame("config"), reader.sessions)
    assert config.changes == () and config.session == 1


def test_a_run_without_config_records_has_no_config(tmp_path: Path) -> None:
    """No config record (or records without the field): None, never an exception."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, base_record(10, train_loss=1.0))
    reader = read_run(path)
    assert run_config(reader.frame("config"), reader.sessions) is None
    append_records(path, base_record(20, event="config"))
    reader = read_run(path)
    assert run_config(reader.frame("config"), reader.sessions) is None


def test_config_written_by_the_writer_reaches_the_view_once_per_snapshot(tmp_path: Path) -> None:
    """write_config → store view → view_config, memoised per snapshot, and the runs page's config column."""
    state = TrainingState()
    with MetricsWriter(RunContext(tmp_path / "w", "w", "s1")) as writer:
        writer.write("session_start", state)
        writer.write_config(state, CONFIG)
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        view = store.view("w")
        assert view_config(view) is view_config(view)
        assert view_config(view).values["optim.sched.warmup"] == "100"
        assert store.runs_table().set_index("run").loc["w", "config"]["model"] == "gpt2"
    finally:
        store.close()


def test_config_table_shortens_long_values_and_keeps_hostile_text_as_is() -> None:
    """Table cells are plain text: markup stays literal (dataframe cells render none), long values cut."""
    hostile = {"[x](https://evil.example)": "<img src=x onerror=alert(1)>", "**k**": "v" * 500}
    config = run_config(pd.DataFrame({"config": [hostile], "session_id": ["s"], "step": [0]}), [])
    table = config_table(config)
    assert table["key"].tolist() == ["[x](https://evil.example)", "**k**"]
    assert table["value"][0] == "<img src=x onerror=alert(1)>"
    assert len(table["value"][1]) == 120 and table["value"][1].endswith("…")
    assert config.session is None  # a session id not among the sessions: said, not guessed


def test_diff_across_runs_shows_only_differing_keys_and_missing_ones() -> None:
    """Keys equal in every run are hidden unless asked; a key one run lacks differs; a run with no config lacks all."""
    configs = {"a": {"lr": "0.1", "model": "gpt2", "only_a": "1"}, "b": {"lr": "0.2", "model": "gpt2"}, "c": None}
    diff = config_diff(configs)
    assert diff.index.tolist() == ["lr", "model", "only_a"]
    assert diff.loc["only_a"].tolist() == ["1", NOT_SET, NOT_SET]
    two = config_diff({"a": configs["a"], "b": configs["b"]})
    assert two.index.tolist() == ["lr", "only_a"]
    assert config_diff({"a": configs["a"], "b": configs["b"]}, differing_only=False).index.tolist() == [
        "lr", "model", "only_a"]  # fmt: skip
    assert config_diff({"a": {"x": "1"}, "b": {"x": "1"}}).empty


def test_run_columns_stay_unique_when_long_names_share_a_prefix() -> None:
    """Two 100-character names that differ only at the end still get two columns."""
    names = ["p" * 99 + "1", "p" * 99 + "2"]
    labels = column_names(names)
    assert len(set(labels)) == 2 and all(len(label) <= 40 for label in labels)
    assert config_diff({names[0]: {"x": "1"}, names[1]: {"x": "2"}}).shape == (1, 2)


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("optim.lr=3e-4", [("optim.lr", "3e-4", False)]),
        ("model!=gpt2 a=b=c", [("model", "gpt2", True), ("a", "b=c", False)]),
        ('"name=my run" x=', [("name", "my run", False), ("x", "", False)]),
        ("", []),
    ],
)
def test_config_filter_terms(text: str, terms: list) -> None:
    """key=value and key!=value, space-separated, quotes group a term holding a space."""
    parsed, error = parse_config_filter(text)
    assert error is None and [(t.key, t.value, t.negated) for t in parsed] == terms


@pytest.mark.parametrize("text", ["lr", "=3", '"unclosed'])
def test_a_bad_config_filter_is_a_message(text: str) -> None:
    """A term without key=value, or an open quote, filters nothing and says why."""
    parsed, error = parse_config_filter(text)
    assert parsed == [] and "Showing all runs" in error


def test_filter_by_config_compares_numbers_as_numbers_and_misses_absent_keys() -> None:
    """3e-4 matches 0.0003; a run without the key fails key=value and passes key!=value."""
    table = pd.DataFrame({"run": ["a", "b", "c"]})
    configs = {"a": {"optim.lr": "0.0003", "model": "gpt2"}, "b": {"optim.lr": "0.0001"}, "c": None}
    assert filter_by_config(table, configs, "optim.lr=3e-4")[0]["run"].tolist() == ["a"]
    assert filter_by_config(table, configs, "model!=gpt2")[0]["run"].tolist() == ["b", "c"]
    assert filter_by_config(table, configs, "optim.lr=1e-4 model=gpt2")[0].empty
    shown, error = filter_by_config(table, configs, "nonsense")
    assert len(shown) == 3 and error


def test_config_columns_are_text_and_never_replace_a_table_column() -> None:
    """A chosen key becomes a column (empty where a run lacks it); one named like a column is prefixed."""
    table = pd.DataFrame({"run": ["a", "b"], "status": ["running", "finished"]})
    configs = {"a": {"lr": "0.1", "status": "<b>x</b>"}, "b": None}
    shown = with_config_columns(table, configs, ["lr", "status"])
    assert shown["status"].tolist() == ["running", "finished"]
    assert shown["config: status"].tolist() == ["<b>x</b>", None]
    assert shown["lr"].tolist() == ["0.1", None]


def test_runs_table_drops_the_raw_config_and_tolerates_error_rows() -> None:
    """An error row's config is NaN; the page's table has no raw config column."""
    table = pd.DataFrame({"run": ["a", "bad"], "status": ["running", "error"], "config": [{"lr": "0.1"}, float("nan")]})
    shown, error = runs_table(table, keys=["lr"], config_filter="")
    assert error is None and "config" not in shown.columns and shown["lr"].tolist() == ["0.1", None]
    assert runs_table(table, keys=[], config_filter="lr=0.1")[0]["run"].tolist() == ["a"]
