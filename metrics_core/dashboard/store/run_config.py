"""A run's hyperparameters as the store holds them: its ``config`` records, parsed.

``MetricsWriter.write_config`` (and ``training_session(config=...)``) logs one ``config`` record
per session, the one record that may nest.  Here:

* ``flatten_config`` turns the nested object into dotted keys (``optim.lr``) with text values:
  strings as written, everything else as compact JSON (``0.0003``, ``true``, ``null``,
  ``[0.9, 0.95]``), so a table cell, a CSV and a filter all see the same text;
* ``run_config`` picks the run's config — the last ``config`` record, i.e. the latest session
  that logged one — and lists what changed from one config record to the next, labelled with
  the session and step where it happened (a learning rate changed on resume is exactly what a
  user must see).

The store parses a run's config once per reader (the runs table's config columns); the pages show
it through ``views.config_tables``.  A file is not a writer: the ``config`` field may be a scalar
or a list, a record may lack it, keys may contain dots or be empty; none of that raises, and a
flattened config keeps at most ``MAX_KEYS`` keys (a hostile 1 MiB line of tiny keys must not make
a 100,000-option widget).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from metrics_core.read.run_reader import Session

MAX_KEYS = 2000  # flattened keys kept per config record
ROOT_KEY = "(config)"  # the key of a config field that is not an object


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
        for key in key_union([before, after]):
            if before.get(key) != after.get(key):
                changes.append(
                    ConfigChange(-1 if index is None else index, sid, step, key, before.get(key), after.get(key))
                )
    (values, dropped), sid, step = records[-1]
    return RunConfig(values, _session_index(sessions, sid), sid, step, len(records), tuple(changes), dropped)


def key_union(configs: Iterable[Mapping[str, str] | None]) -> list[str]:
    """Every key of any of ``configs``, in the order they first appear."""
    keys: dict[str, None] = {}
    for config in configs:
        keys.update(dict.fromkeys(config or ()))
    return list(keys)
