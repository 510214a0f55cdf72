"""What an import did, as the command prints it: counts, what was skipped (said once per run),
and one line per damaged file or refused data."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ImportReport:
    """What an import did, for the command to print."""

    runs: int = 0
    sessions: int = 0
    records: int = 0
    scalars: int = 0
    nonfinite: int = 0
    skipped: dict[str, Counter[str]] = field(default_factory=dict)  # per run: kind -> values
    notes: list[str] = field(default_factory=list)  # one line each: damage, refused data, repairs
    problems: int = 0  # notes that mean data was not imported

    def lines(self) -> list[str]:
        lines = [
            f"imported {self.scalars} scalars as {self.records} records in {self.sessions} new sessions "
            f"of {self.runs} runs"
        ]
        if self.nonfinite:
            lines.append(f"{self.nonfinite} NaN or infinite values written as missing (JSON has neither)")
        for run, kinds in sorted(self.skipped.items()):
            what = ", ".join(f"{kind}: {count}" for kind, count in sorted(kinds.items()))
            lines.append(f"{run}: skipped {sum(kinds.values())} non-scalar values ({what})")
        return lines + self.notes
