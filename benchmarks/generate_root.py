"""A cluster head's runs root for the runs page benchmark: 990 small runs, 9 of 100k
records and one live run.

Small runs hold 100 train records and end with a ``session_end`` (every 10th is left without one:
a crashed run); the big ones come from ``generate.write_run``.  Written once into ``root`` and
reused when ``root/.complete`` says it is whole (the 100k runs take a while to write).
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.testing.generate import BASE_TIME_NS, record, train_values, write_run

SMALL, BIG = 990, 9
LIVE = "live/now"


def small_run(path: Path, number: int) -> None:
    import random

    rng = random.Random(number)
    session = f"s-{number}"
    t_ns = BASE_TIME_NS + number * 10**12
    lines = [record(session, "session_start", 0, 0, 0, t_ns)]
    lines.append(record(session, "config", 0, 0, 0, t_ns, config={"optim": {"lr": 1e-4 * (1 + number % 5)}}))
    for step in range(10, 1010, 10):
        t_ns += 10**9
        lines.append(record(session, "train", step, step * 1000, 0, t_ns, **train_values(step, rng)))
    if number % 10:
        lines.append(record(session, "session_end", 1000, 1_000_000, 0, t_ns, status="finished"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(lines))


def make_root(root: Path, *, small: int = SMALL, big: int = BIG, big_records: int = 100_000) -> Path:
    """``root`` with ``small`` small runs, ``big`` big ones and the live run's first records."""
    done = root / ".complete"
    if done.exists() and orjson.loads(done.read_bytes()) == [small, big, big_records]:
        return root
    for number in range(small):
        small_run(root / f"team{number % 10}" / f"sweep-{number:04d}" / "metrics.jsonl", number)
    for number in range(big):
        write_run(root / "big" / f"pretrain-{number}" / "metrics.jsonl", big_records, seed=number)
    small_run(root / LIVE / "metrics.jsonl", 10**6)
    done.write_bytes(orjson.dumps([small, big, big_records]))
    return root


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--small", type=int, default=SMALL)
    parser.add_argument("--big", type=int, default=BIG)
    parser.add_argument("--big-records", type=int, default=100_000)
    args = parser.parse_args()
    print(make_root(args.root, small=args.small, big=args.big, big_records=args.big_records))
