"""The compare page's chart controls, each in the URL (``url_state``):
``/compare?run=a&run=b&metric=val_loss&group=peak_lr&band=std&x=epoch&smoothing=0.8&log=1`` opens
the view it names.

* ``metric`` (repeated): the metrics charted, ``DEFAULT_METRICS`` when none is named; one the
  picked runs do not log (yet: they may still be read) is kept, as the widget keeps a chosen one;
* ``x``: a mode of ``X_MODES`` or a key every compared run that logs it lets grow
  (``compare_x_keys``); one that does not is refused with a message;
* ``group``: the runs as single lines (``none``), grouped by a config key, or by a run-name
  pattern (``name:<pattern>``, ``views.groups``); with no ``group`` asked, ``default_group``
  (beyond ``MANY_RUNS`` runs the swept key of fewest values, so a hundred runs open grouped);
* ``band``: the groups' band, min–max or ± one standard deviation;
* ``smoothing`` and ``log``: as on the run page (``url_state.smoothing_slider``, ``log_y_toggle``).

Widgets are found by key (``compare_metrics``, ``compare_x``, ``compare_group``,
``compare_group_pattern``, ``compare_band``, ``smoothing``, ``log_y``); what they choose is a
``CompareOptions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import streamlit as st

from metrics_core.dashboard.controls.url_state import log_y_toggle, smoothing_slider, to_url, url_choice, url_texts
from metrics_core.dashboard.display_text import md_text
from metrics_core.dashboard.figures.group_figures import BANDS
from metrics_core.dashboard.store.run_store import RunView
from metrics_core.dashboard.views.compare import compare_metrics, compare_x_keys
from metrics_core.dashboard.views.config_tables import view_config
from metrics_core.dashboard.views.groups import NAME_PREFIX, SINGLE, default_group, group_error, run_groups, swept_keys
from metrics_core.dashboard.views.x_keys import X_MODES, x_error

DEFAULT_METRICS = ["train_loss", "val_loss", "grad_norm_avg", "lr", "tokens_per_s"]
BY_NAME = "(run-name pattern)"  # the group choice whose pattern is typed beside it
GROUP_KEY, PATTERN_KEY = "compare_group", "compare_group_pattern"


@dataclass(frozen=True)
class CompareOptions:
    """What the compare page's chart controls chose: the metrics, the x axis, the runs' groups
    (None: each run its own line) with their band, the smoothing and the y scale."""

    metrics: list[str]
    x: str
    groups: dict[str, list[str]] | None
    band: str
    smoothing: float
    log_y: bool


def compare_controls(views: Mapping[str, RunView]) -> CompareOptions:
    """The chart controls of ``views`` (the picked runs), seeded from the URL and written back to it."""
    url_texts("metric", "compare_metrics", default=DEFAULT_METRICS)
    choices = compare_metrics(views)  # the mission's metrics, then every logged key
    metrics = st.multiselect(
        "Metrics",
        [*choices, *(metric for metric in st.session_state["compare_metrics"] if metric not in choices)],
        key="compare_metrics",
        format_func=lambda m: choices.get(m, (None, m))[1],
    )
    to_url("metric", metrics, default=DEFAULT_METRICS)
    keys = compare_x_keys(views)
    choices = [*X_MODES, *keys]
    url_choice("x", "compare_x", choices, default="step", refusal=lambda asked: x_error(asked, keys))
    x = st.selectbox("x axis", choices, format_func=lambda x: X_MODES.get(x, x), key="compare_x")
    to_url("x", x, default="step")
    configs = {name: config.values if (config := view_config(view)) else None for name, view in views.items()}
    group = _group_control(configs)
    grouped = group != SINGLE
    band = "minmax"
    if grouped:
        url_choice("band", "compare_band", list(BANDS), default="minmax")
        band = st.radio("Band", list(BANDS), format_func=BANDS.get, key="compare_band", horizontal=True)
    to_url("band", band, default="minmax")
    groups = run_groups(list(views), configs, group) if grouped else None
    return CompareOptions(metrics, x, groups, band, smoothing_slider(), log_y_toggle("Log-scale y"))


def _group_control(configs: Mapping[str, Mapping[str, str] | None]) -> str:
    """The grouping chosen (``views.groups``' syntax): a select of single runs, the config keys the
    runs differ in (a key every run shares makes one group: no choice) and a run-name pattern typed
    beside it."""
    options = [SINGLE, *swept_keys(configs), BY_NAME]
    default = default_group(configs)
    state = st.session_state
    if GROUP_KEY not in state:
        asked = st.query_params.get("group", default)
        if asked.startswith(NAME_PREFIX):
            state[GROUP_KEY], state[PATTERN_KEY] = BY_NAME, asked[len(NAME_PREFIX) :]
        elif asked in options:
            state[GROUP_KEY] = asked
        else:
            st.warning(md_text(f"group={asked!r} is not a config key of these runs; each run is its own line"))
            state[GROUP_KEY] = SINGLE
    elif state[GROUP_KEY] not in options:
        state[GROUP_KEY] = SINGLE
    picked = st.selectbox(
        "Group runs",
        options,
        key=GROUP_KEY,
        format_func=lambda key: "single runs" if key == SINGLE else key,
        help="One line per group: the mean of its runs at each x, over a band.",
    )
    group = picked
    if picked == BY_NAME:
        pattern = st.text_input(
            "Run-name pattern",
            key=PATTERN_KEY,
            placeholder="e.g. -seed*",
            help="Runs whose names are equal once the first match is cut out form a group; * is any text.",
        )
        group = NAME_PREFIX + pattern
        if error := group_error(group):
            st.error(md_text(error))
            group = SINGLE
    to_url("group", group, default=default)
    return group
