"""Runs in groups on the compare page: which runs draw as one line, and under what name.

A grouping is one text, as the URL carries it (``?group=``):

* ``<config key>`` (``peak_lr``, ``optim.lr``): runs with the same value of the key (as
  ``run_config.flatten_config`` writes it) form a group, named ``peak_lr=0.0003``; runs without
  the key form the group ``peak_lr=(not set)``;
* ``name:<pattern>``: runs whose names are equal once the first match of ``<pattern>`` is cut out
  form a group, named by what is left (``name:-seed*`` groups ``lr3e-4-seed0`` and
  ``lr3e-4-seed1`` as ``lr3e-4``).  In the pattern ``*`` stands for any text and everything else
  for itself.  Matched by ``str.find`` of its literal pieces, leftmost first: linear in the name,
  no regular expression, so no pattern makes the page backtrack;
* ``none``: every run its own line (``SINGLE``).

A page with more than ``MANY_RUNS`` runs and no grouping asked for groups by ``default_group``:
the swept key (its values differ between the runs) with the fewest values, else all runs as one
group, so a hundred runs never make a hundred-entry legend.  Pure functions of names and configs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

NAME_PREFIX = "name:"
SINGLE = "none"
ALL_RUNS = NAME_PREFIX + "*"
MANY_RUNS = 12
NOT_SET = "(not set)"
MAX_PATTERN_CHARS = 200


def cut_first_match(name: str, pattern: str) -> str | None:
    """``name`` with the first (leftmost) match of ``pattern`` cut out, ``*`` matching any text
    (a leading one from the name's start, a trailing one to its end); None when it does not match.
    Each literal piece is found with ``str.find`` after the previous one: O(pieces × name)."""
    pieces = pattern.split("*")
    if not any(pieces):  # "*" alone: the whole name
        return ""
    first, rest = pieces[0], pieces[1:]
    start = 0 if not first else name.find(first)
    if start < 0:
        return None
    end = start + len(first)
    for piece in rest:
        if not piece:
            continue
        found = name.find(piece, end)
        if found < 0:
            return None
        end = found + len(piece)
    if rest and not rest[-1]:  # a trailing "*": to the end
        end = len(name)
    return name[:start] + name[end:]


def swept_keys(configs: Mapping[str, Mapping[str, str] | None]) -> list[str]:
    """The config keys whose values differ between the runs (absent counts as a value), sorted by
    how many values they take, fewest first, then by name: the keys a sweep varied."""
    keys = sorted({key for config in configs.values() if config for key in config})
    counts = {key: len({(config or {}).get(key) for config in configs.values()}) for key in keys}
    return sorted((key for key, count in counts.items() if count > 1), key=lambda key: (counts[key], key))


def default_group(configs: Mapping[str, Mapping[str, str] | None]) -> str:
    """The grouping of a page that asked for none: single runs up to ``MANY_RUNS``, beyond that
    the swept key of fewest values, else all runs as one group."""
    if len(configs) <= MANY_RUNS:
        return SINGLE
    swept = swept_keys(configs)
    return swept[0] if swept else ALL_RUNS


def group_error(group: str) -> str | None:
    """Why ``group`` (from the URL or a text box) is no grouping, or None when it is one."""
    if group.startswith(NAME_PREFIX):
        pattern = group[len(NAME_PREFIX) :]
        if len(pattern) > MAX_PATTERN_CHARS:
            return f"A name pattern is at most {MAX_PATTERN_CHARS} characters"
        return None if pattern else "A name pattern after name: is missing (e.g. name:-seed*)"
    return None if group else "No config key to group by"


def run_groups(
    names: Sequence[str], configs: Mapping[str, Mapping[str, str] | None], group: str
) -> dict[str, list[str]]:
    """The runs ``names`` in groups by ``group`` (the module's syntax): group name -> its runs, in
    the order each group's first run comes; ``SINGLE`` (or an invalid grouping) puts each run in
    a group of its own, named by the run."""
    if group == SINGLE or group_error(group) is not None:
        return {name: [name] for name in names}
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(group_label(name, configs.get(name), group), []).append(name)
    return groups


def group_label(name: str, config: Mapping[str, str] | None, group: str) -> str:
    """The group run ``name`` (with ``config``) falls in under ``group``."""
    if group.startswith(NAME_PREFIX):
        pattern = group[len(NAME_PREFIX) :]
        cut = cut_first_match(name, pattern)
        if cut is None:
            return name  # not matched: a group of its own
        return cut or "all runs"
    value = (config or {}).get(group)
    return f"{group}={NOT_SET if value is None else value}"


def legend_name(label: str, runs: int) -> str:
    """A group's legend entry: its name and how many runs it holds ("peak_lr=0.0003 (4 runs)")."""
    return f"{label} ({runs} run{'s' if runs != 1 else ''})"
