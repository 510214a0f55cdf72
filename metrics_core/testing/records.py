"""Hand-crafted records, as the writer would produce them, for files that tests and benchmarks
write byte by byte (``metrics_core.testing.generate`` writes whole realistic runs)."""

from __future__ import annotations

import json
from typing import Any


def base_record(step: int = 0, *, event: str = "train", session: str = "s1", **values: object) -> dict:
    """A valid record as the writer would produce it, for hand-crafted files."""
    return {
        "schema_version": 1,
        "time": f"2026-11-29T10:{step // 60 % 60:02d}:{step % 60:02d}.000000+00:00",
        "run_id": "r",
        "session_id": session,
        "event": event,
        "step": step,
        "tokens_seen": step * 100,
        "skipped_updates": 0,
        **values,
    }


def line(record: dict[str, Any]) -> bytes:
    """One compact JSON line; the standard library also writes integers beyond 64 bits."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
