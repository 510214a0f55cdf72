"""A run's hyperparameters (its ``config`` records) as the pages show them: pure functions.

``MetricsWriter.write_config`` (and ``training_session(config=...)``) logs one ``config`` record
per session, the one record that may nest.  Here:

* ``view_config`` is a snapshot's config (``store.run_config``: flattened to dotted keys with
  text values, and what changed from one config record to the next), once per snapshot;
* ``config_table`` and ``changes_table`` show it;
* ``config_diff`` lines the configs of several runs up, one column per run; ``swept_keys`` names
  the keys whose values differ between runs (a sweep's axes);
* ``config_filter`` parses ``key=value`` / ``key!=value`` terms for the runs table.

Keys and values come from files: they are returned as plain strings and shown only through
dataframe cells (which render no markup) or the escaping helpers of ``runs_table``.  A file is
not a writer: the ``config`` field may be a scalar or a list, a record may lack it, keys may
contain dots or be empty; none of that raises, and a flattened config keeps at most
``MAX_KEYS`` keys (a hostile 1 MiB line of tiny keys must not make a 100,000-option widget).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pandas as pd

from metrics_core.dashboard.display_text import CELL_CHARS, shorten
from metrics_core.dashboard.store.run_config import RunConfig, key_union, run_config
from metrics_core.dashboard.store.snapshot import EMPTY, Kept
from metrics_core.read.session_model import session_name

if TYPE_CHECKING:
    from metrics_core.read.run_reader import Session

NOT_SET = "(not set)"  # how a table shows a key a run (or a session's record) does not have


class ConfigSource(Protocol):
    """What ``view_config`` reads of a run snapshot (the store's ``RunView``)."""

    @property
    def frames(self) -> Mapping[str, pd.DataFrame]: ...
    @property
    def sessions(self) -> Sequence[Session]: ...
    def kept(self, key: Hashable) -> Kept: ...


def view_config(view: ConfigSource) -> RunConfig | None:
    """``run_config`` of a snapshot, computed once per snapshot and shared by every tab and page."""
    kept = view.kept("config")
    with kept.lock:
        if kept.value is EMPTY:
            kept.value = run_config(view.frames["config"], view.sessions)
        return kept.value


def config_keys(configs: Iterable[Mapping[str, str] | None]) -> list[str]:
    """Every key of any of ``configs``, sorted (the runs page's choice of columns)."""
    return sorted(key_union(configs))


def config_table(config: RunConfig) -> pd.DataFrame:
    """The run page's table: one row per key, long values shortened (cells are plain text)."""
    return pd.DataFrame(
        {
            "key": [shorten(key, CELL_CHARS) for key in config.values],
            "value": [shorten(value, CELL_CHARS) for value in config.values.values()],
        }
    )


def changes_table(config: RunConfig) -> pd.DataFrame:
    """What changed at each resume: session (numbered from 1), step, key, before, after."""
    return pd.DataFrame(
        [
            {
                "session": session_name(c.session) if c.session >= 0 else shorten(c.session_id, 20),
                "step": c.step,
                "key": shorten(c.key, CELL_CHARS),
                "before": _cell(c.before),
                "after": _cell(c.after),
            }
            for c in config.changes
        ],
        columns=["session", "step", "key", "before", "after"],
    )


def _cell(value: str | None, missing: str | None = NOT_SET) -> str | None:
    return missing if value is None else shorten(value, CELL_CHARS)


def column_names(names: Sequence[str], limit: int = 40) -> list[str]:
    """Column headers for runs: shortened, made unique when two long names share a prefix."""
    result: list[str] = []
    for name in names:
        label, number = shorten(name, limit), 1
        while label in result:
            number += 1
            label = f"{shorten(name, limit - 4)} #{number}"
        result.append(label)
    return result


def config_diff(configs: Mapping[str, Mapping[str, str] | None], *, differing_only: bool = True) -> pd.DataFrame:
    """Keys by runs: one row per key (the index), one column per run, ``NOT_SET`` where a run
    lacks the key.  With ``differing_only``, only keys whose value (or presence) differs between
    the runs (compared in full, before shortening); a run without any config lacks every key."""
    keys = config_keys(configs.values())
    values = {key: [(config or {}).get(key) for config in configs.values()] for key in keys}
    if differing_only:
        values = {key: found for key, found in values.items() if len(set(found)) > 1}
    rows = {key: [_cell(value) for value in found] for key, found in values.items()}
    table = pd.DataFrame.from_dict(rows, orient="index", columns=column_names(list(configs)), dtype=object)
    table.index = [shorten(key, CELL_CHARS) for key in rows]
    table.index.name = "key"
    return table


# -- filtering the runs table -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfigTerm:
    key: str
    value: str
    negated: bool

    def matches(self, config: Mapping[str, str] | None) -> bool:
        found = (config or {}).get(self.key)
        equal = found is not None and _same_value(found, self.value)
        return equal != self.negated


def _same_value(found: str, wanted: str) -> bool:
    """Text equality, or numeric equality when both read as numbers (``3e-4`` is ``0.0003``)."""
    if found == wanted:
        return True
    try:
        a, b = float(found), float(wanted)
    except ValueError:
        return False
    return a == b or (math.isnan(a) and math.isnan(b))


def parse_config_filter(text: str) -> tuple[list[ConfigTerm], str | None]:
    """``optim.lr=3e-4 model!=gpt2 "name=my run"`` as terms, or an error saying what is wrong.

    Terms are separated by spaces (quote a term that holds one); each is ``key=value`` or
    ``key!=value``; all must hold.  An error message is plain text (the page escapes it).
    """
    try:
        words = shlex.split(text)
    except ValueError as exc:
        return [], f"Cannot read the config filter: {exc}. Showing all runs."
    terms = []
    for word in words:
        negated = word.find("!=") != -1 and word.find("!=") + 1 == word.find("=")  # "!=" before any "="
        key, sep, value = word.partition("!=" if negated else "=")
        if not sep or not key:
            return [], f"Config filter term {shorten(word)!r} is not key=value or key!=value. Showing all runs."
        terms.append(ConfigTerm(key, value, negated))
    return terms, None


def filter_by_config(
    table: pd.DataFrame, configs: Mapping[str, Mapping[str, str] | None], text: str
) -> tuple[pd.DataFrame, str | None]:
    """Rows of the runs table (column ``run``) whose config satisfies every term of ``text``."""
    terms, error = parse_config_filter(text)
    if error or not terms:
        return table, error
    keep = table["run"].map(lambda name: all(term.matches(configs.get(name)) for term in terms))
    return table[keep.astype(bool)], None


def swept_keys(configs: Iterable[Mapping[str, str] | None]) -> list[str]:
    """The keys whose value (or presence) differs between the runs that have a config, sorted: a
    sweep's axes (``peak_lr``, ``seed``), without the keys every run shares.  A run without any
    config (not read yet, or unreadable) is left out, not counted as lacking every key.
    O(runs × keys)."""
    present = [config for config in configs if isinstance(config, Mapping) and config]
    if len(present) < 2:
        return []
    return sorted(key for key in key_union(present) if len({config.get(key) for config in present}) > 1)


def with_config_columns(
    table: pd.DataFrame, configs: Mapping[str, Mapping[str, str] | None], keys: Sequence[str]
) -> pd.DataFrame:
    """The runs table with one text column per chosen config key (empty where a run lacks it);
    a key named like an existing column becomes ``config: key``."""
    columns = {}
    found = [configs.get(name) or {} for name in table["run"].tolist()]  # a list: iterating a string column is slow
    for key in keys:
        header = key if key not in table.columns and key not in columns else f"config: {key}"
        values = [_cell(config.get(key), None) for config in found]
        columns[shorten(header, CELL_CHARS)] = pd.Series(values, index=table.index, dtype=object)
    return table.assign(**columns) if columns else table


MAX_SWEPT_COLUMNS = 12  # swept keys shown by default: a hostile root of 2,000-key configs keeps a table


def table_configs(table: pd.DataFrame) -> dict[str, Mapping[str, str] | None]:
    """Each run's flattened config from the store's runs table (None for a row without one)."""
    return {
        run: config if isinstance(config, Mapping) else None  # an error row has none
        for run, config in zip(table["run"].tolist(), table["config"].tolist(), strict=True)
    }


def column_keys(
    configs: Mapping[str, Mapping[str, str] | None], runs: Iterable[str], keys: Sequence[str], *, swept: bool
) -> list[str]:
    """The config keys shown as columns for ``runs``: the chosen ``keys``, after the first
    ``MAX_SWEPT_COLUMNS`` keys swept between ``runs`` when ``swept``."""
    if not swept:
        return list(keys)
    varying = swept_keys(configs.get(run) for run in runs)[:MAX_SWEPT_COLUMNS]
    return [*varying, *(key for key in keys if key not in varying)]


def runs_table(
    table: pd.DataFrame, *, keys: Sequence[str], config_filter: str, swept: bool = False
) -> tuple[pd.DataFrame, str | None]:
    """The runs page's table from ``RunStore.runs_table()``: filtered by ``config_filter``, with the
    config keys of ``column_keys`` as columns, and without the raw ``config`` column.  The runs page
    itself adds the columns to the page of rows it draws only (``runs_table_view.runs_page_view``)."""
    configs = table_configs(table)
    shown, error = filter_by_config(table, configs, config_filter)
    keys = column_keys(configs, shown["run"].tolist(), keys, swept=swept)
    return with_config_columns(shown.drop(columns="config"), configs, keys), error
