"""Realistic synthetic metrics.jsonl files for the benchmarks and the tests of long runs.

Three sessions with overlapping resume windows (each resumes from a checkpoint older than its
crash), validation every 50 steps, checkpoints every 200, ~400-byte train lines like a real
trainer's. Written with orjson in bulk: the point is the file, not the writer's speed.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import orjson

RUN_ID = "llama-7b-pretrain-lr3e-4-bs1024-ctx4096-2026-11-29"
BASE_TIME_NS = 1_764_400_000 * 10**9


def record(session: str, event: str, step: int, tokens_seen: int, skipped: int, t_ns: int, **values: object) -> bytes:
    seconds, nanos = divmod(t_ns, 10**9)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos // 1000:06d}+00:00"
    base = {
        "schema_version": 1,
        "time": stamp,
        "run_id": RUN_ID,
        "session_id": session,
        "event": event,
        "step": step,
        "tokens_seen": tokens_seen,
        "skipped_updates": skipped,
    }
    return orjson.dumps({**base, **values}, option=orjson.OPT_APPEND_NEWLINE)


def train_values(step: int, rng: random.Random) -> dict[str, object]:
    updates = 10 - (1 if rng.random() < 0.05 else 0)
    return {
        "train_loss": 2.0 + 8.0 / math.sqrt(step + 1) + rng.gauss(0, 0.02),
        "lr": 3e-4 * min(1.0, step / 2000),
        "tokens": 4_194_304,
        "attempted_updates": 10,
        "updates": updates,
        "skipped_updates_in_window": 10 - updates,
        "grad_norm_avg": abs(rng.gauss(0.8, 0.1)),
        "grad_norm_max": abs(rng.gauss(1.4, 0.3)),
        "clipped_fraction": rng.choice((0.0, 0.1, 0.2)),
        "nonfinite_grad_norms": 0,
    }


def eval_values(keys: int, step: int) -> dict[str, float]:
    """A per-task evaluation of ``keys`` tasks (``eval/task_0000``...), as trainers log it on the
    train record every thousand steps: keys that most records lack."""
    return {f"eval/task_{task:04d}": round(0.5 + 0.4 * math.sin(step / 1000 + task), 4) for task in range(keys)}


def write_run(path: Path, records: int, *, seed: int = 0, eval_keys: int = 0, evals: int = 20) -> int:
    """Write about ``records`` records in three sessions to ``path``; return the count written.
    ``eval_keys``: ``evals`` train records, evenly spread, also hold that many ``eval_values``."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    per_session = int(records / 1.25 / 3)  # + validation every 5th and checkpoint every 20th window
    eval_every = max(1, 3 * (per_session - 1) // max(evals, 1))
    trains = 0
    written, step, t_ns, skipped = 0, 0, BASE_TIME_NS, 0
    with open(path, "wb") as out:
        for index in range(3):
            session = f"20251129T{index:02d}0000Z-gpu-node-{17 + index:03d}-pid{40000 + index}"
            resume = max(0, step - 10 * (per_session // 20)) if index else 0  # replay ~5 % of a session
            step, t_ns = resume, t_ns + 120 * 10**9
            lines = [
                record(
                    session,
                    "session_start",
                    step,
                    step * 419_430,
                    skipped,
                    t_ns,
                    discarded_bytes=0 if index == 0 else 211,
                    resumed_from_step=resume if index else None,
                )
            ]
            for _ in range(per_session - 1):
                step += 10
                t_ns += 2 * 10**9
                values = train_values(step, rng)
                skipped += values["skipped_updates_in_window"]
                trains += 1
                if eval_keys and trains % eval_every == 0 and trains // eval_every <= evals:
                    values.update(eval_values(eval_keys, step))
                lines.append(record(session, "train", step, step * 419_430, skipped, t_ns, **values))
                if step % 50 == 0:
                    lines.append(
                        record(
                            session,
                            "validation",
                            step,
                            step * 419_430,
                            skipped,
                            t_ns,
                            val_loss=2.1 + 8.0 / math.sqrt(step + 1),
                            val_tokens=1_048_576,
                        )
                    )
                if step % 200 == 0:
                    lines.append(
                        record(
                            session,
                            "checkpoint",
                            step,
                            step * 419_430,
                            skipped,
                            t_ns,
                            path=f"/shared/ckpt/{RUN_ID}/step-{step:08d}.pt",
                        )
                    )
                if len(lines) >= 10_000:
                    out.write(b"".join(lines))
                    written += len(lines)
                    lines.clear()
            out.write(b"".join(lines))
            written += len(lines)
    return written


def write_resumed_run(path: Path, records: int, sessions: int, *, seed: int = 0) -> int:
    """Write ``records`` records in ``sessions`` sessions of about equal length (a run on
    preemptible nodes), each a ``session_start`` resumed one window before the last one its
    predecessor logged, then train windows (a validation every 5th): every resume supersedes
    one train window.  The same ``records`` in any number of sessions; return the count written."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    written, step, t_ns, skipped = 0, 0, BASE_TIME_NS, 0
    with open(path, "wb") as out:
        for index in range(sessions):
            length = records * (index + 1) // sessions - records * index // sessions
            session = f"20251129T{index:06d}Z-spot-{index % 97:03d}-pid{40000 + index}"
            step, t_ns = max(0, step - 10) if index else 0, t_ns + 60 * 10**9
            lines = [record(session, "session_start", step, step * 419_430, skipped, t_ns, resumed_from_step=step)]
            while len(lines) < length:
                step += 10
                t_ns += 2 * 10**9
                values = train_values(step, rng)
                lines.append(record(session, "train", step, step * 419_430, skipped, t_ns, **values))
                if step % 50 == 0 and len(lines) < length:
                    lines.append(
                        record(
                            session, "validation", step, step * 419_430, skipped, t_ns, val_loss=values["train_loss"]
                        )
                    )
            out.write(b"".join(lines))
            written += len(lines)
    return written
