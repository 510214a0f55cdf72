"""The loss-sanity checks over a whole run's train frame (pandas): the definition of every finding.

A loss that looks too good is usually an averaging bug: metrics computed over a subset of the
batches, a skipped step counted as an update, counters that do not add up.  Each check turns one
such bug into a finding that names the session, the step range and how many records are
affected; a clean run gets a single line saying what was checked.

Checks on ``train`` windows: ``attempted_updates == updates + skipped_updates_in_window``; tokens
per attempted update against the run's median (a session's first window, partial, left out);
cumulative ``tokens_seen``, ``skipped_updates`` and ``step`` advancing by exactly the window's
``tokens``, ``skipped_updates_in_window`` and ``updates``; steps and times increasing within a
session; missing losses; windows with no successful update; tokens per step changing across a
resume; the loss jumping across a resume; in data-parallel runs, one rank persistently slower
than the others (a straggler).  Ingest health (``health.ingest_findings``): bad lines, a torn
tail, schema versions, reader resets.  ``diagnostics.diagnose`` runs them incrementally.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pandas as pd

from metrics_core.analysis.derived import ReplayWindow, replay_windows, tokens_per_step
from metrics_core.read.health import ACCOUNTING, MISSING_LOSS, Finding, IngestHealth, ingest_findings, session_finding
from metrics_core.read.session_model import Session

TOKENS_FAR_OFF = 2.0  # a window with < 1/2 or > 2x the median tokens is flagged
TOKENS_PER_STEP_CHANGE = 0.10
LOSS_JUMP = 0.05  # relative difference of redo vs replaced loss over a replay window
# A straggler: the same rank slowest in >= STRAGGLER_WINDOWS consecutive windows, each with the
# slowest rank's time per attempt >= STRAGGLER_RATIO x the fastest rank's (its throughput ratio).
STRAGGLER_WINDOWS = 5
STRAGGLER_RATIO = 1.2


def per_session(check: str, severity: str, train: pd.DataFrame, bad: np.ndarray, what: str) -> list[Finding]:
    """One finding per session that has rows flagged in ``bad``."""
    findings = []
    flagged = train[bad]
    for session_id, rows in flagged.groupby("session_id", observed=True, sort=False):
        first, last = int(rows["step"].min()), int(rows["step"].max())
        findings.append(session_finding(check, severity, str(session_id), first, last, len(rows), what))
    return findings


def _consecutive(train: pd.DataFrame, column: str) -> pd.Series:
    """Change of ``column`` since the previous train window of the same session (NaN for the first)."""
    return train.groupby("session_id", observed=True)[column].diff()


COUNTS = ("attempted_updates", "updates", "skipped_updates_in_window")
ADVANCES = (("tokens_seen", "tokens"), ("skipped_updates", "skipped_updates_in_window"), ("step", "updates"))
INCREASING = (("step", "steps"), ("time", "times"))
STRAGGLER_COLUMNS = ("slowest_rank", "rank_step_time_max_s", "rank_step_time_min_s")
# The train fields the checks read: a findings' frame holds these alone.
CHECKED_FIELDS = frozenset(
    {"session_id", "time", "train_loss", *COUNTS, *(column for pair in ADVANCES for column in pair), *STRAGGLER_COLUMNS}
)
# Each per-row check: (check, severity, what its flagged windows did); ACCOUNTING and MISSING_LOSS are
# health's, which the terminal tools check too.
ADVANCE_CHECKS = {
    cumulative: (
        f"{cumulative} vs windows",
        "error",
        f"where {cumulative} did not advance by the window's {per_window}",
    )
    for cumulative, per_window in ADVANCES
}
INCREASING_CHECKS = {
    column: (f"{what} increasing", "error", f"where {what} went backwards") for column, what in INCREASING
}
NO_UPDATE = ("no successful update", "info", "with no successful update (every attempt skipped)")
TOKENS_PER_UPDATE = "tokens per update"


def tokens_what(median: float) -> str:
    return (
        f"with tokens per attempted update far from the run's median of {median:,.0f} "
        "(metrics over a subset of batches?)"
    )


def _window_checks(train: pd.DataFrame) -> list[Finding]:
    findings: list[Finding] = []
    columns = set(train.columns)
    if set(COUNTS) <= columns:
        counts = train[list(COUNTS)]
        bad = (counts.notna().all(axis=1) & (counts.iloc[:, 0] != counts.iloc[:, 1] + counts.iloc[:, 2])).to_numpy()
        findings += per_session(*ACCOUNTING[:2], train, bad, ACCOUNTING[2])
    if "tokens" in columns and len(train):
        findings += tokens_per_update(train)
    for cumulative, per_window in ADVANCES:
        if per_window in columns:
            advance = _consecutive(train, cumulative)
            bad = (advance.notna() & (advance != train[per_window])).to_numpy()
            check, severity, what = ADVANCE_CHECKS[cumulative]
            findings += per_session(check, severity, train, bad, what)
    for column, _ in INCREASING:
        went_back = (
            _consecutive(train, column) < pd.Timedelta(0) if column == "time" else _consecutive(train, column) < 0
        ).to_numpy()
        check, severity, what = INCREASING_CHECKS[column]
        findings += per_session(check, severity, train, went_back, what)
    if "train_loss" in columns:
        findings += per_session(*MISSING_LOSS[:2], train, train["train_loss"].isna().to_numpy(), MISSING_LOSS[2])
    if "updates" in columns:
        findings += per_session(*NO_UPDATE[:2], train, (train["updates"] == 0).to_numpy(), NO_UPDATE[2])
    return findings


def tokens_per_attempt(train: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each window's tokens per attempted update, and whether it is judged (finite, attempted, and
    not its session's first window)."""
    tokens = pd.to_numeric(train["tokens"], errors="coerce").to_numpy(dtype=np.float64)
    attempts = (
        pd.to_numeric(train["attempted_updates"], errors="coerce").to_numpy(dtype=np.float64)
        if "attempted_updates" in train.columns
        else np.ones(len(train))
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        per_update = tokens / attempts
    return per_update, np.isfinite(per_update) & (attempts > 0) & train["session_id"].duplicated().to_numpy()


def far_off(per_update: np.ndarray, median: float) -> np.ndarray:
    ratio = per_update / median
    return (ratio < 1 / TOKENS_FAR_OFF) | (ratio > TOKENS_FAR_OFF)


def tokens_per_update(train: pd.DataFrame) -> list[Finding]:
    """Windows whose tokens per attempted update are far from the run's median.

    Per attempted update, not per window: a loop that logs every N iterations has short windows
    at every start and resume, which are partial, not wrong.  A session's first window is
    partial by nature (it begins wherever the checkpoint left the loop) and is left out.
    """
    per_update, judged = tokens_per_attempt(train)
    if not judged.any():
        return []
    median = float(np.median(per_update[judged]))
    if median <= 0:
        return []
    return per_session(TOKENS_PER_UPDATE, "warning", train, judged & far_off(per_update, median), tokens_what(median))


def batch_change(previous: Session, session: Session, before: float | None, after: float | None) -> list[Finding]:
    if not (before and after and abs(after - before) / before > TOKENS_PER_STEP_CHANGE):
        return []
    return [
        Finding(
            "warning",
            "tokens per step at resume",
            f"session {session.session_id} (resumed at step {session.resume_step}) trains "
            f"{after:,.0f} tokens per step, session {previous.session_id} {before:,.0f}: batch size changed?",
            session.session_id,
            session.first_step,
            session.last_step,
        )
    ]


def loss_jump(session: Session, window: ReplayWindow) -> list[Finding]:
    delta = window.loss_delta
    if delta is None or not window.earlier_loss or abs(delta) / abs(window.earlier_loss) <= LOSS_JUMP:
        return []
    return [
        Finding(
            "warning",
            "loss jump at resume",
            f"session {session.session_id} redid steps {window.first_step}–{window.last_step} at mean loss "
            f"{window.redo_loss:.4g} vs {window.earlier_loss:.4g} before the crash ({delta:+.4g}): data loader "
            "position, LR schedule or batch size not restored?",
            session.session_id,
            window.first_step,
            window.last_step,
            window.redo_records,
        )
    ]


def _resume_checks(train: pd.DataFrame, sessions: Sequence[Session], redone: np.ndarray) -> list[Finding]:
    findings = []
    for previous, session in pairwise(sessions):
        before, after = tokens_per_step(train, previous.session_id), tokens_per_step(train, session.session_id)
        findings += batch_change(previous, session, before, after)
    for window in replay_windows(train, sessions, redone):
        findings += loss_jump(sessions[window.session], window)
    return findings


def straggler_finding(
    session_id: str, rank: int, first_step: int, last_step: int, longest: int, ratios: np.ndarray
) -> Finding:
    return Finding(
        "warning",
        "straggler rank",
        f"session {session_id}, steps {first_step}–{last_step}: rank {rank} was the slowest rank in "
        f"{longest} consecutive windows, its time per attempt "
        f"{float(np.median(ratios)):.2f}× the fastest rank's (median; up to "
        f"{float(np.max(ratios)):.2f}×): slow GPU, node, network link or data loader?",
        session_id,
        first_step,
        last_step,
        len(ratios),
    )


def slowness(slowest: np.ndarray, longest: np.ndarray, shortest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per window: the slowest rank's time over the fastest's, and whether that makes it slow."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = longest / shortest
    return ratio, np.isfinite(slowest) & (ratio >= STRAGGLER_RATIO)


def straggler_checks(train: pd.DataFrame) -> list[Finding]:
    """One warning per (session, rank) that was the slowest rank by a margin, window after window.

    Uses the per-rank health fields of ``metrics_core.write.distributed``; a single slow window (a
    checkpoint save, a GC pause) is noise, a streak is a slow GPU, node, NIC or data loader.
    """
    if not set(STRAGGLER_COLUMNS) <= set(train.columns):
        return []
    findings = []
    for session_id, rows in train.groupby("session_id", observed=True, sort=False):
        slowest, longest, shortest = (
            pd.to_numeric(rows[c]).to_numpy(dtype=np.float64, na_value=np.nan) for c in STRAGGLER_COLUMNS
        )
        ratio, slow = slowness(slowest, longest, shortest)
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
            findings.append(
                straggler_finding(
                    str(session_id),
                    rank,
                    int(steps[spans[0][0]]),
                    int(steps[spans[-1][1] - 1]),
                    max(end - first for first, end in spans),
                    ratio[flagged],
                )
            )
    return findings


def diagnose_from_scratch(
    *,
    train: pd.DataFrame,
    sessions: Sequence[Session],
    redone: np.ndarray,
    ingest: IngestHealth,
) -> list[Finding]:
    """Every finding for a run by the pandas checks over every row: the definition ``diagnose``
    is tested against, and what it runs on data its incremental path does not take."""
    checks = _window_checks(train) + straggler_checks(train) + _resume_checks(train, sessions, redone)
    return with_ingest(checks, train, sessions, ingest)


def with_ingest(
    checks: list[Finding], train: pd.DataFrame, sessions: Sequence[Session], ingest: IngestHealth
) -> list[Finding]:
    findings = checks + ingest_findings(ingest)
    if not findings:
        findings.append(
            Finding(
                "ok",
                "all",
                f"All checks passed on {len(train)} train windows in {len(sessions)} session(s).",
                records=len(train),
            )
        )
    return findings
