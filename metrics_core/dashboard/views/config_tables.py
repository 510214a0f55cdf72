"""A run's hyperparameters (its ``config`` records) as the pages show them: pure functions.

``MetricsWriter.write_config`` (and ``training_session(config=...)``) logs one ``config`` record
per session, the one record that may nest.  Here:

* ``flatten_config`` turns the nested object into dotted keys (``optim.lr``) with text values:
  strings as written, everything else as compact JSON (``0.0003``, ``true``, ``null``,
  ``[0.9, 0.95]``), so a table cell, a CSV and a filter all see the same text;
* ``run_config`` picks the run's config — the last ``config`` record, i.e. the latest session
  that logged one — and lists what changed from one config record to the next, labelled with
  the session and step where it happened (a learning rate changed on resume is exactly what a
  user must see);
* ``config_diff`` lines the configs of several runs up, one column per run;
* ``config_filter`` parses ``key=value`` / ``key!=value`` terms for the runs table.

Keys and values come from files: they are returned as plain strings and shown only through
dataframe cells (which render no markup) or the escaping helpers of ``runs_table``.  A file is
not a writer: the ``config`` field may be a scalar or a list, a record may lack it, keys may
contain dots or be empty; none of that raises, and a flattened config keeps at most
``MAX_KEYS`` keys (a hostile 1 MiB line of tiny keys must not make a 100,000-option widget).
"""

from __future__ import annotations

import itertools
import json
import math
import shlex
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pandas as pd

from metrics_core.dashboard.display_text import CELL_CHARS, shorten

if TYPE_CHECKING:
    from metrics_core.read.run_reader import Session

MAX_KEYS = 2000  # flattened keys kept per config record
ROOT_KEY = "(config)"  # the key of a config field that is not an object
NOT_SET = "(not set)"  # how a table shows a key a run (or a session's record) does not have


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One key whose value differs from the previous config record (``None``: absent there/here)."""

    session: int  # index of the session that logged the new value
    session_id: str
    step: int
    key: str
    before: str | None
    after: str | None


@dataclass(frozen=True, slots=True)
class RunConfig:
    """The run's current config (flattened) and where it came from."""

    values: dict[str, str]
    session: int | None  # index of the session whose record this is
    session_id: str
    step: int
    records: int  # config records in the run
    changes: tuple[ConfigChange, ...] = field(default=())
    dropped_keys: int = 0  # keys beyond MAX_KEYS, not shown


def value_text(value: Any) -> str:
    """A config value as text: a string as written, anything else as compact one-line JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return str(value)


def flatten_config(tree: Any, *, max_keys: int = MAX_KEYS) -> tuple[dict[str, str], int]:
    """``tree`` as ``{dotted.key: text}`` and how many keys were dropped beyond ``max_keys``.

    Objects nest into dotted paths; an empty object and every list are leaves (their JSON).  A
    key that a dotted path already produced (``{"a.b": 1, "a": {"b": 2}}``) gets `` #2``, so no
    value is silently lost.  A ``tree`` that is not an object is one key, ``ROOT_KEY``.
    """
    flat: dict[str, str] = {}
    dropped = 0
    if not isinstance(tree, Mapping):
        return ({} if tree is None else {ROOT_KEY: value_text(tree)}), 0
    stack: list[tuple[str, Any]] = [(str(key), value) for key, value in reversed(tree.items())]
    while stack:  # iterative: a deep hostile object cannot reach the recursion limit
        path, value = stack.pop()
        if isinstance(value, Mapping) and value:
            stack.extend((f"{path}.{key}", item) for key, item in reversed(value.items()))
            continue
        if len(flat) >= max_keys:
            dropped += 1
            continue
        key, number = path, 1
        while key in flat:
            number += 1
            key = f"{path} #{number}"
        flat[key] = value_text(value)
    return flat, dropped


def _session_index(sessions: Sequence[Session], session_id: str) -> int | None:
    return next((s.index for s in sessions if s.session_id == session_id), None)


def run_config(frame: pd.DataFrame, sessions: Sequence[Session]) -> RunConfig | None:
    """The run's config from its ``config`` records (``frame``, in file order), or None if none.

    The last record is the current config; each record is compared with the one before, and
    every added, removed or changed key is a ``ConfigChange`` at that record's session and step.
    """
    if frame.empty or "config" not in frame.columns:
        return None
    columns = (frame["config"], frame["session_id"], frame["step"])
    records = [(flatten_config(tree), str(sid), int(step)) for tree, sid, step in zip(*columns, strict=True)]
    changes: list[ConfigChange] = []
    for ((before, _), _, _), ((after, _), sid, step) in itertools.pairwise(records):
        index = _session_index(sessions, sid)
        for key in _union([before, after]):
            if before.get(key) != after.get(key):
                changes.append(ConfigChange(-1 if index is None else index, sid, step, key,
                                            before.get(key), after.get(key)))  # fmt: skip
    (values, dropped), sid, step = records[-1]
    return RunConfig(values, _session_index(sessions, sid), sid, step, len(records), tuple(changes), dropped)


_T = TypeVar("_T")


class ConfigSource(Protocol):
    """What ``view_config`` reads of a run snapshot (the store's ``RunView``)."""

    @property
    def frames(self) -> Mapping[str, pd.DataFrame]: ...
    @property
    def sessions(self) -> Sequence[Session]: ...
    def memo(self, key: Hashable, compute: Callable[[], _T]) -> _T: ...


def view_config(view: ConfigSource) -> RunConfig | None:
    """``run_config`` of a snapshot, computed once per snapshot and shared by every tab and page."""
    return view.memo("config", lambda: run_config(view.frames["config"], view.sessions))


def _union(configs: Iterable[Mapping[str, str] | None]) -> list[str]:
    keys: dict[str, None] = {}
    for config in configs:
        keys.update(dict.fromkeys(config or ()))
    return list(keys)


def config_keys(configs: Iterable[Mapping[str, str] | None]) -> list[str]:
    """Every key of any of ``configs``, sorted (the runs page's choice of columns)."""
    return sorted(_union(configs))


def config_table(config: RunConfig) -> pd.DataFrame:
    """The run page's table: one row per key, long values shortened (cells are plain text)."""
    return pd.DataFrame(
        {"key": [shorten(key, CELL_CHARS) for key in config.values],
         "value": [shorten(value, CELL_CHARS) for value in config.values.values()]}
    )  # fmt: skip


def changes_table(config: RunConfig) -> pd.DataFrame:
    """What changed at each resume: session (numbered from 1), step, key, before, after."""
    return pd.DataFrame(
        [{"session": f"S{c.session + 1}" if c.session >= 0 else shorten(c.session_id, 20), "step": c.step,
          "key": shorten(c.key, CELL_CHARS), "before": _cell(c.before), "after": _cell(c.after)}
         for c in config.changes],
        columns=["session", "step", "key", "before", "after"],
    )  # fmt: skip


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


def with_config_columns(
    table: pd.DataFrame, configs: Mapping[str, Mapping[str, str] | None], keys: Sequence[str]
) -> pd.DataFrame:
    """The runs table with one text column per chosen config key (empty where a run lacks it);
    a key named like an existing column becomes ``config: key``."""
    columns = {}
    for key in keys:
        header = key if key not in table.columns and key not in columns else f"config: {key}"
        values = [_cell((configs.get(name) or {}).get(key), None) for name in table["run"]]
        columns[shorten(header, CELL_CHARS)] = pd.Series(values, index=table.index, dtype=object)
    return table.assign(**columns) if columns else table


def runs_table(table: pd.DataFrame, *, keys: Sequence[str], config_filter: str) -> tuple[pd.DataFrame, str | None]:
    """The runs page's table from ``RunStore.runs_table()``: filtered by ``config_filter``, with the
    chosen config ``keys`` as columns, and without the raw ``config`` column."""
    configs = {run: config if isinstance(config, Mapping) else None  # an error row has none
               for run, config in zip(table["run"], table["config"], strict=True)}  # fmt: skip
    shown, error = filter_by_config(table, configs, config_filter)
    return with_config_columns(shown.drop(columns="config"), configs, keys), error
