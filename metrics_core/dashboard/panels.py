"""What the pages show of a run beside its charts: the run page's row of health and config buttons
(``health_panel``, ``config_panel``), its session key and why it stopped; the compare page's config
diff; the sessions page's table of sessions.

Findings, stop reasons, session ids and config keys come from the run's file: each goes on the page
escaped and shortened (``display_text``), or as a dataframe cell, which is plain text.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd
import streamlit as st

from metrics_core.analysis.diagnostics import Finding
from metrics_core.dashboard.display_text import (
    WORD_CHARS,
    clock_text,
    human_count,
    md_text,
    shorten,
    shorten_words,
    stamp_text,
)
from metrics_core.dashboard.figures.layout import session_colour, session_key
from metrics_core.dashboard.store.run_store import RunView
from metrics_core.dashboard.views.config_tables import RunConfig, changes_table, config_diff, config_table
from metrics_core.read.session_model import session_name
from metrics_core.text import MISSING

SEVERITY_ICONS = {
    "error": ":material/error:",
    "warning": ":material/warning:",
    "info": ":material/info:",
    "ok": ":material/check_circle:",
}
SEVERITY_COLOURS = {"error": "red", "warning": "orange", "info": "blue", "ok": "green"}  # Streamlit's text colours
# The run page's row of health and config buttons, and its session key: one line each (widgets.CALM_CSS)
PANELS_KEY = "run_panels"
SESSION_KEY_KEY = "session_key"


def session_key_panel(view: RunView) -> None:
    """One key of the run's session colours for every chart on the page (charts list series only),
    on one line whatever the number of sessions (it scrolls sideways when it does not fit): the
    charts below it never move (``widgets.CALM_CSS``).

    Only generated text goes into this HTML: "S2", a hex colour from the palette, and a step number.
    """
    items = " ".join(
        f'<span style="color:{colour}">━ <b>{label}</b> {html.escape(what)}</span>'
        for label, colour, what in session_key(view.sessions)
    )
    faint = " · faint: superseded" if len(view.sessions) > 1 else ""
    with st.container(key=SESSION_KEY_KEY):
        st.markdown(f"Sessions: {items}{faint}", unsafe_allow_html=True)


def health_panel(findings: Sequence[Finding]) -> None:
    """Diagnostics, worst first, behind one button of the run page's status row that says the
    worst severity in its colour and names the worst check: a glance tells whether the run is
    healthy, and a long list of findings never pushes the charts below the fold (the row is one
    line whatever the findings).  Messages embed session
    ids, bad-line reasons and excerpts from the file, so they are escaped and their long tokens cut."""
    order = {"error": 0, "warning": 1, "info": 2, "ok": 3}
    ranked = sorted(findings, key=lambda f: order[f.severity])
    worst = ranked[0]
    more = f" (+{len(ranked) - 1} more)" if len(ranked) > 1 else ""
    label = f"{worst.severity} — {md_text(shorten(worst.check, WORD_CHARS))}{more}" if worst.severity != "ok" else "ok"
    with st.popover(f":{SEVERITY_COLOURS[worst.severity]}[Health: {label}]", icon=SEVERITY_ICONS[worst.severity]):
        for finding in ranked:
            st.markdown(
                f"{SEVERITY_ICONS[finding.severity]} **{md_text(finding.check)}** — "
                f"{md_text(shorten_words(finding.message))}"
            )


def finding_text(finding: Finding) -> str:
    """A finding's message for ``st.warning`` and friends: escaped, long tokens cut."""
    return md_text(shorten_words(finding.message))


def config_panel(config: RunConfig | None) -> None:
    """The run's config as a key → value table, and what changed at each resume, behind a button
    of the status row whose label says so (a learning rate changed on resume is what the user must
    not miss: the label names the keys).  Keys and values are dataframe cells (plain text); the
    session id is escaped."""
    if config is None:
        st.caption(
            "No config logged", help="Pass `config=` to `training_session`, or call `write_config`.", width="content"
        )
        return
    changed = sorted({change.key for change in config.changes})
    label = f"Config ({len(config.values)} keys)"
    if changed:
        label += f" · :orange[changed at resume: {md_text(shorten(', '.join(changed), WORD_CHARS))}]"
    with st.popover(label, icon=":material/tune:"):
        session = session_name(config.session) if config.session is not None else "an unknown session"
        st.caption(
            f"From the config record of session {session} (id {md_text(repr(shorten(config.session_id, 40)))}, "
            f"step {config.step}); {config.records} config record(s) in the run."
            + (f" {config.dropped_keys} further keys not shown." if config.dropped_keys else "")
        )
        st.dataframe(config_table(config), hide_index=True, width="stretch")
        if config.changes:
            st.markdown("**Changed from the previous config record**")
            st.dataframe(changes_table(config), hide_index=True, width="stretch")


def config_diff_panel(configs: dict[str, dict[str, str] | None]) -> None:
    """The compare page's table: config keys by run, only those that differ unless asked."""
    st.subheader("Config")
    if not any(config is not None for config in configs.values()):
        st.caption("None of these runs logged a config.")
        return
    every_key = st.toggle("Show identical keys too", key="config_all")
    table = config_diff(configs, differing_only=not every_key)
    if table.empty:
        st.caption("Their configs are identical." if len(configs) > 1 else "Pick another run to see what differs.")
        return
    st.dataframe(table, width="stretch")


REASON_CHARS = 400  # a stop reason above the charts: an exception's message, within reason

# What each column of the sessions table means, shown on hover of its header.  Short headers and
# no session id or record count on the page (the CSV has every column): the table fits 1,400 px.
SESSION_COLUMNS = {
    "session": "S1, S2, …: the session's colour on every chart of the run, and its name in tail and summary",
    "start": "its first record, UTC",
    "end": "its last record, UTC (the time alone on the day it started)",
    "duration": "from its first record to its last, h:mm:ss",
    "downtime": "before it: from the previous session's last record to its first, time the run did not train",
    "steps": "the steps of its first and last records",
    "resume step": "the step it resumed from: the earlier sessions' records after it are superseded",
    "replayed": "steps an earlier session had already trained, trained again after this resume",
    "replayed tokens": "tokens of those steps, trained again (≤: a bound, where the records cannot place the resume "
    "inside a log window)",
    "tokens/s": "mean tokens trained per second over its duration",
    "torn bytes": "torn tail the writer cut when this session opened the file (0: a clean start)",
    "skipped": "optimizer updates skipped in its windows (FP16 overflow)",
    "ended": "how it ended: its session_end record, else crashed (a later session exists) or the run's status",
    "reason": "why it ended: the exception (and the rank it came from), the signal, or what a crash means",
}


def sessions_table(table: pd.DataFrame) -> None:
    """``derived.session_table`` as a data grid (cells are text, never markdown) within 1,400 px:
    times to the second, durations as h:mm:ss, counts compact (1.2M), a missing value as "—",
    the session number in its chart colour, and each column explained on hover."""
    bounds = zip(table["tokens replayed"], table["tokens replayed is an upper bound"], strict=True)
    spans = zip(table["start"], table["end"], strict=True)
    steps = zip(table["first step"], table["last step"], strict=True)
    shown = pd.DataFrame(
        {
            "session": [session_name(number - 1) for number in table["session"]],
            "start": table["start"].map(stamp_text),
            "end": [stamp_text(end, date=not _same_day(start, end)) for start, end in spans],
            "duration": table["duration (s)"].map(clock_text),
            "downtime": table["downtime before (s)"].map(clock_text),
            "steps": [f"{_step(first)}–{_step(last)}" for first, last in steps],
            "resume step": table["resume step"].map(_step),
            "replayed": table["steps replayed"],
            "replayed tokens": [("≤ " if bound else "") + human_count(tokens) for tokens, bound in bounds],
            "tokens/s": table["mean tokens/s"].map(human_count),
            "torn bytes": table["discarded bytes"].map(_step),
            "skipped": table["skipped updates"].map(_step),
            "ended": table["end status"],
            "reason": table["reason"].map(lambda text: text if isinstance(text, str) else MISSING),
        }
    )
    colours = [f"color: {session_colour(number - 1)}; font-weight: 600" for number in table["session"]]
    styled = shown.style.apply(lambda _: colours, subset=["session"])
    config = {column: st.column_config.Column(column, help=help) for column, help in SESSION_COLUMNS.items()}
    config["replayed"] = st.column_config.NumberColumn("replayed", help=SESSION_COLUMNS["replayed"], format="localized")
    config["reason"] = st.column_config.TextColumn("reason", help=SESSION_COLUMNS["reason"], width="medium")
    st.dataframe(styled, hide_index=True, column_config=config)


def _step(count: object) -> str:
    """A count in full (a step, bytes), or "—" where unknown."""
    return MISSING if count is None or pd.isna(count) else f"{int(count):,}"


def _same_day(start: object, end: object) -> bool:
    return stamp_text(start)[:10] == stamp_text(end)[:10]


def stopped_panel(view: RunView) -> None:
    """Why the run stopped, above its charts: an interruption (a scheduler's SIGTERM) as a warning,
    a failure or a crash as an error; the reason comes from the file, so it is escaped and cut."""
    if not view.reason:
        return
    text = md_text(shorten_words(f"{view.status.capitalize()}: {view.reason}", REASON_CHARS))
    if view.status == "interrupted":
        st.warning(text, icon=":material/pause_circle:")
    else:
        st.error(text, icon=":material/error:")
