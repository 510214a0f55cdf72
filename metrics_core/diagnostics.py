"""Loss-sanity diagnostics computed from the records themselves.

A loss that looks too good is usually an averaging bug: metrics computed over a subset of the
batches, a skipped step counted as an update, counters that do not add up.  Each check here
turns one such bug into a finding that names the session, the step range and how many records
are affected; a clean run gets a single line saying what was checked.

Checks on ``train`` windows: ``attempted_updates == updates + skipped_updates_in_window``; tokens
per attempted update against the run's median (a session's first window, partial, left out);
cumulative ``tokens_seen``, ``skipped_updates`` and ``step`` advancing by exactly the window's
``tokens``, ``skipped_updates_in_window`` and ``updates``; steps and times increasing within a
session; missing losses; windows with no successful update; tokens per step changing across a
resume; the loss jumping across a resume; in data-parallel runs, one rank persistently slower than
the others (a straggler).  Ingest health:
bad lines, bytes pending after the last newline, schema versions, reader resets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pandas as pd

from metrics_core.analysis import replay_windows, tokens_per_step
from metrics_core.reader import IngestHealth, RunReader, Session

TOKENS_FAR_OFF = 2.0  # a window with < 1/2 or > 2x the median tokens is flagged
TOKENS_PER_STEP_CHANGE = 0.10
LOSS_JUMP = 0.05  # relative difference of redo vs replaced loss over a replay window
# A straggler: the same rank slowest in >= STRAGGLER_WINDOWS consecutive windows, each with the
# slowest rank's time per attempt >= STRAGGLER_RATIO x the fastest rank's (its throughput ratio).
STRAGGLER_WINDOWS = 5
STRAGGLER_RATIO = 1.2


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnostic result. ``severity``: ``error``, ``warning``, ``info`` or ``ok``."""

    severity: str
    check: str
    message: str
    session: str | None = None
    first_step: int | None = None
    last_step: int | None = None
    records: int = 0


def _per_session(check: str, severity: str, train: pd.DataFrame, bad: np.ndarray, what: str) -> list[Finding]:
    """One finding per session that has rows flagged in ``bad``."""
    findings = []
    flagged = train[bad]
    for session_id, rows in flagged.groupby("session_id", observed=True, sort=False):
        first, last = int(rows["step"].min()), int(rows["step"].max())
        findings.append(
            Finding(
                severity,
                check,
                f"session {session_id}, steps {first}–{last}: {len(rows)} window(s) {what}",
                str(session_id),
                first,
                last,
                len(rows),
            )
        )
    return findings


def _consecutive(train: pd.DataFrame, column: str) -> pd.Series:
    """Change of ``column`` since the previous train window of the same session (NaN for the first)."""
    return train.groupby("session_id", observed=True)[column].diff()


def _window_checks(train: pd.DataFrame) -> list[Finding]:
    findings: list[Finding] = []
    columns = set(train.columns)
    if {"attempted_updates", "updates", "skipped_updates_in_window"} <= columns:
        counts = train[["attempted_updates", "updates", "skipped_updates_in_window"]]
        bad = (counts.notna().all(axis=1) & (counts.iloc[:, 0] != counts.iloc[:, 1] + counts.iloc[:, 2])).to_numpy()
        findings += _per_session("window accounting", "error", train, bad,
                                 "where attempted_updates ≠ updates + skipped_updates_in_window")  # fmt: skip
    if "tokens" in columns and len(train):
        findings += _tokens_per_update(train)
    for cumulative, per_window in (("tokens_seen", "tokens"), ("skipped_updates", "skipped_updates_in_window"),
                                   ("step", "updates")):  # fmt: skip
        if per_window in columns:
            advance = _consecutive(train, cumulative)
            bad = (advance.notna() & (advance != train[per_window])).to_numpy()
            findings += _per_session(f"{cumulative} vs windows", "error", train, bad,
                                     f"where {cumulative} did not advance by the window's {per_window}")  # fmt: skip
    for column, what in (("step", "steps"), ("time", "times")):
        went_back = (_consecutive(train, column) < pd.Timedelta(0) if column == "time"
                     else _consecutive(train, column) < 0).to_numpy()  # fmt: skip
        findings += _per_session(f"{what} increasing", "error", train, went_back, f"where {what} went backwards")
    if "train_loss" in columns:
        findings += _per_session("missing loss", "warning", train, train["train_loss"].isna().to_numpy(),
                                 "with no train_loss (no tokens, or not logged)")  # fmt: skip
    if "updates" in columns:
        findings += _per_session("no successful update", "info", train, (train["updates"] == 0).to_numpy(),
                                 "with no successful update (every attempt skipped)")  # fmt: skip
    return findings


def _tokens_per_update(train: pd.DataFrame) -> list[Finding]:
    """Windows whose tokens per attempted update are far from the run's median.

    Per attempted update, not per window: a loop that logs every N iterations has short windows
    at every start and resume, which are partial, not wrong.  A session's first window is
    partial by nature (it begins wherever the checkpoint left the loop) and is left out.
    """
    tokens = pd.to_numeric(train["tokens"], errors="coerce").to_numpy(dtype=np.float64)
    attempts = (
        pd.to_numeric(train["attempted_updates"], errors="coerce").to_numpy(dtype=np.float64)
        if "attempted_updates" in train.columns
        else np.ones(len(train))
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        per_update = tokens / attempts
    judged = np.isfinite(per_update) & (attempts > 0) & train["session_id"].duplicated().to_numpy()
    if not judged.any():
        return []
    median = float(np.median(per_update[judged]))
    if median <= 0:
        return []
    ratio = per_update / median
    bad = judged & ((ratio < 1 / TOKENS_FAR_OFF) | (ratio > TOKENS_FAR_OFF))
    return _per_session(
        "tokens per update",
        "warning",
        train,
        bad,
        f"with tokens per attempted update far from the run's median of {median:,.0f} "
        "(metrics over a subset of batches?)",
    )


def _resume_checks(
    train: pd.DataFrame, sessions: Sequence[Session], replaced: Mapping[int, np.ndarray]
) -> list[Finding]:
    findings = []
    for previous, session in pairwise(sessions):
        before, after = (
            tokens_per_step(train, previous.session_id),
            tokens_per_step(train, session.session_id),
        )
        if before and after and abs(after - before) / before > TOKENS_PER_STEP_CHANGE:
            findings.append(Finding(
                "warning", "tokens per step at resume",
                f"session {session.session_id} (resumed at step {session.resume_step}) trains "
                f"{after:,.0f} tokens per step, session {previous.session_id} {before:,.0f}: batch size changed?",
                session.session_id, session.first_step, session.last_step,
            ))  # fmt: skip
    for window in replay_windows(train, sessions, replaced):
        delta = window.loss_delta
        if delta is not None and window.earlier_loss and abs(delta) / abs(window.earlier_loss) > LOSS_JUMP:
            session = sessions[window.session]
            findings.append(Finding(
                "warning", "loss jump at resume",
                f"session {session.session_id} redid steps {window.first_step}–{window.last_step} at mean loss "
                f"{window.redo_loss:.4g} vs {window.earlier_loss:.4g} before the crash ({delta:+.4g}): data loader "
                "position, LR schedule or batch size not restored?",
                session.session_id, window.first_step, window.last_step, window.redo_records,
            ))  # fmt: skip
    return findings


def _straggler_checks(train: pd.DataFrame) -> list[Finding]:
    """One warning per (session, rank) that was the slowest rank by a margin, window after window.

    Uses the per-rank health fields of ``metrics_core.distributed``; a single slow window (a
    checkpoint save, a GC pause) is noise, a streak is a slow GPU, node, NIC or data loader.
    """
    columns = ("slowest_rank", "rank_step_time_max_s", "rank_step_time_min_s")
    if not set(columns) <= set(train.columns):
        return []
    findings = []
    for session_id, rows in train.groupby("session_id", observed=True, sort=False):
        slowest, longest, shortest = (pd.to_numeric(rows[c]).to_numpy(dtype=np.float64, na_value=np.nan)
                                      for c in columns)  # fmt: skip
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = longest / shortest
        slow = np.isfinite(slowest) & (ratio >= STRAGGLER_RATIO)
        steps = rows["step"].to_numpy()
        streaks: dict[int, list[tuple[int, int]]] = {}  # rank -> [(first row, end row)]
        start = 0
        for row in range(1, len(rows) + 1):
            if row == len(rows) or not (slow[row] and slow[start] and slowest[row] == slowest[start]):
                if slow[start] and row - start >= STRAGGLER_WINDOWS:
                    streaks.setdefault(int(slowest[start]), []).append((start, row))
                start = row
        for rank, spans in streaks.items():
            flagged = np.concatenate([np.arange(first, end) for first, end in spans])
            first_step, last_step = int(steps[spans[0][0]]), int(steps[spans[-1][1] - 1])
            findings.append(Finding(
                "warning", "straggler rank",
                f"session {session_id}, steps {first_step}–{last_step}: rank {rank} was the slowest rank in "
                f"{max(end - first for first, end in spans)} consecutive windows, its time per attempt "
                f"{float(np.median(ratio[flagged])):.2f}× the fastest rank's (median; up to "
                f"{float(np.max(ratio[flagged])):.2f}×): slow GPU, node, network link or data loader?",
                str(session_id), first_step, last_step, len(flagged),
            ))  # fmt: skip
    return findings


def _ingest_checks(ingest: IngestHealth) -> list[Finding]:
    findings = []
    if ingest.bad_lines:
        where = "; ".join(f"line {b.line}: {b.reason}" for b in ingest.bad_line_samples[:5])
        findings.append(Finding("warning", "bad lines", f"{ingest.bad_lines} line(s) skipped — {where}",
                                records=ingest.bad_lines))  # fmt: skip
    if ingest.pending_bytes:
        findings.append(Finding("info", "pending bytes", f"{ingest.pending_bytes} byte(s) after the last newline: "
                                "a record being written, or the torn tail of a crash"))  # fmt: skip
    newer = {version: count for version, count in ingest.schema_versions.items() if version != 1}
    if newer:
        count = sum(newer.values())
        findings.append(Finding("info", "schema versions", f"records with schema_version {sorted(newer)} "
                                f"({count} records) read as version 1", records=count))  # fmt: skip
    if ingest.resets:
        findings.append(Finding("warning", "reader resets", f"re-read from the start {ingest.resets} time(s): "
                                + "; ".join(ingest.reset_reasons[-3:])))  # fmt: skip
    return findings


def diagnose(
    *,
    train: pd.DataFrame,
    sessions: Sequence[Session],
    replaced: Mapping[int, np.ndarray],
    ingest: IngestHealth,
) -> list[Finding]:
    """Every finding for a run, or one ``ok`` finding saying what a clean run passed."""
    findings = (
        _window_checks(train)
        + _straggler_checks(train)
        + _resume_checks(train, sessions, replaced)
        + _ingest_checks(ingest)
    )
    if not findings:
        findings.append(Finding("ok", "all", f"All checks passed on {len(train)} train windows in "
                                f"{len(sessions)} session(s).", records=len(train)))  # fmt: skip
    return findings


def diagnose_reader(reader: RunReader) -> list[Finding]:
    """``diagnose`` on everything a reader has read so far."""
    return diagnose(
        train=reader.frame("train"),
        sessions=reader.sessions,
        replaced={s.index: reader.replaced_by(s.index, "train") for s in reader.sessions},
        ingest=reader.ingest_health(),
    )
