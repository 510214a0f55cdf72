"""Findings about a run's health that need no numpy: what reading the file ran into, and the shape
of a per-session finding.  Shared by the dashboard's diagnostics (``metrics_core.analysis.diagnostics``,
pandas) and the terminal tools (``metrics_core.read.run_digest``), so both say the same thing the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from metrics_core.read.records import BadLine

ACCOUNTING = ("window accounting", "error", "where attempted_updates ≠ updates + skipped_updates_in_window")
MISSING_LOSS = ("missing loss", "warning", "with no train_loss (no tokens, or not logged)")


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


@dataclass(frozen=True, slots=True)
class IngestHealth:
    """What reading the file ran into: skipped lines, an incomplete tail, versions, restarts."""

    bad_lines: int
    bad_line_samples: tuple[BadLine, ...]
    pending_bytes: int
    schema_versions: dict[int, int]
    resets: int
    reset_reasons: tuple[str, ...]


def session_finding(
    check: str, severity: str, session_id: str, first: int, last: int, count: int, what: str
) -> Finding:
    """A finding about ``count`` train windows of one session, between steps ``first`` and ``last``."""
    return Finding(
        severity,
        check,
        f"session {session_id}, steps {first}–{last}: {count} window(s) {what}",
        session_id,
        first,
        last,
        count,
    )


def ingest_findings(ingest: IngestHealth) -> list[Finding]:
    """Bad lines, a torn tail, newer schema versions and reader restarts, each when there is one."""
    findings = []
    if ingest.bad_lines:
        where = "; ".join(f"{b.where}: {b.reason}" for b in ingest.bad_line_samples[:5])
        findings.append(
            Finding("warning", "bad lines", f"{ingest.bad_lines:,} line(s) skipped — {where}", records=ingest.bad_lines)
        )
    if ingest.pending_bytes:
        findings.append(
            Finding(
                "info",
                "torn tail",
                f"{ingest.pending_bytes:,} byte(s) after the last newline: "
                "a record being written, or the torn tail of a crash",
            )
        )
    newer = {version: count for version, count in ingest.schema_versions.items() if version != 1}
    if newer:
        count = sum(newer.values())
        findings.append(
            Finding(
                "info",
                "schema versions",
                f"records with schema_version {sorted(newer)} ({count} records) read as version 1",
                records=count,
            )
        )
    if ingest.resets:
        findings.append(
            Finding(
                "warning",
                "reader resets",
                f"re-read from the start {ingest.resets} time(s): " + "; ".join(ingest.reset_reasons[-3:]),
            )
        )
    return findings
