"""Crash storm: a real writer process SIGKILLed at random moments and restarted, hundreds of times.

``METRICS_SOAK=N`` runs N kill/restart cycles (default 200); ``METRICS_SOAK_SEED=S`` replays the
kill delays and injected tails of a failed run (the seed is printed, and shown on failure).

Each cycle forks a child from a small persistent launcher (so a restart costs a fork, not a
Python start-up) that runs ``training_session`` like a trainer: ``session_start``, then ``train``
records as fast as it can, every 50th one 16 KiB long so that a kill often lands inside a
multi-page write and tears a line for real.  The child acknowledges each record on stdout after
``write`` returns; the launcher kills it after a random delay.  Between kill and restart the test
measures the torn tail the next session must report, and in some cycles appends a torn line of
its own (what a writer killed mid-line on another host would leave).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson

from metrics_core.read.run_reader import RunReader
from metrics_core.write.crash_safety import tail_start
from metrics_core.write.training_session import training_session

CYCLES = int(os.environ.get("METRICS_SOAK", "200"))

LAUNCHER = r"""
import os, signal, sys, time
from metrics_core.write.training_session import training_session

directory = sys.argv[1]
BIG = "b" * 16384


def train(session_id):
    with training_session(directory, run_id="storm", session_id=session_id, handle_sigterm=False) as session:
        os.write(1, f"ack {session_id} 0\n".encode())
        state = session.state
        while True:
            state.step += 1
            state.tokens_seen += 4096
            pad = BIG if state.step % 50 == 0 else ""
            session.log("train", train_loss=10.0 / state.step, lr=3e-4, tokens=4096, pad=pad)
            os.write(1, f"ack {session_id} {state.step}\n".encode())


while command := sys.stdin.readline():
    session_id, delay_ns = command.split()
    pid = os.fork()
    if pid == 0:
        try:
            train(session_id)
        except BaseException as exc:
            os.write(2, f"{session_id}: {type(exc).__name__}: {exc}\n".encode())
        os._exit(1)
    time.sleep(int(delay_ns) / 1e9)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.write(1, f"dead {session_id} {status}\n".encode())
"""


def torn_tail(path: Path) -> bytes:
    """The bytes after the last newline: the tail the next writer must cut and report."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        start = tail_start(fd, size)
        return os.pread(fd, size - start, start)
    finally:
        os.close(fd)


def kill_delay_ns(rng: random.Random) -> int:
    """A third of the kills land around start-up, open and the first write (~2 ms after the fork
    on a busy 2-core machine); the rest while records stream."""
    if rng.random() < 1 / 3:
        return rng.randrange(3_000_000)
    return rng.randrange(2_000_000, 6_000_000)


def test_crash_storm_loses_no_acknowledged_record_and_reports_every_cut(tmp_path: Path) -> None:
    """SIGKILL at random moments, restart, repeat: every acked record once, every session and cut reported."""
    seed = int(os.environ.get("METRICS_SOAK_SEED", random.SystemRandom().randrange(2**32)))
    print(f"crash storm: {CYCLES} cycles, METRICS_SOAK_SEED={seed}")
    rng = random.Random(seed)
    directory = tmp_path / "storm"
    directory.mkdir()
    path = directory / "metrics.jsonl"
    path.touch()
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    reader = RunReader(path)
    acked: list[tuple[str, int]] = []
    torn_at_start: dict[str, int] = {}
    statuses: Counter[int] = Counter()
    injected = genuine = 0
    try:
        for cycle in range(CYCLES):
            session_id = f"c{cycle:05d}"
            if rng.random() < 0.3:
                line = b'{"schema_version":1,"event":"train","session_id":"elsewhere","pad":"' + b"x" * 3000
                with open(path, "ab") as out:
                    out.write(line[: rng.randrange(1, len(line))])
                injected += 1
            tail = torn_tail(path)
            torn_at_start[session_id] = len(tail)
            launcher.stdin.write(f"{session_id} {kill_delay_ns(rng)}\n".encode())
            launcher.stdin.flush()
            while True:
                kind, sid, value = launcher.stdout.readline().split()
                assert sid == session_id.encode(), f"seed {seed}: output of {sid!r} during {session_id}"
                if kind == b"dead":
                    statuses[int(value)] += 1
                    break
                acked.append((session_id, int(value)))
            genuine += torn_tail(path) not in (b"", tail)
            reader.refresh()  # a reader tailing the storm must never see a torn tail or restart
        launcher.stdin.close()
        assert launcher.wait(timeout=30) == 0
        errors = launcher.stderr.read().decode()
    finally:
        launcher.kill()
        launcher.wait()
    assert errors == "", f"seed {seed}: exceptions in the writer processes:\n{errors}"
    assert statuses == {signal.SIGKILL: CYCLES}, f"seed {seed}: every child must die by SIGKILL, not on its own"

    torn_at_start["final"] = len(torn_tail(path))
    with training_session(directory, run_id="storm", session_id="final", handle_sigterm=False):
        pass
    reader.refresh()
    health = reader.ingest_health()
    assert (health.resets, health.bad_lines, health.pending_bytes) == (0, 0, 0), f"seed {seed}: {health}"

    lines = path.read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]
    keys = Counter((r["session_id"], r["event"], r["step"]) for r in records)
    duplicated = [key for key, count in keys.items() if count > 1]
    assert not duplicated, f"seed {seed}: records written twice: {duplicated[:5]}"
    present = {(sid, step) for sid, event, step in keys if event in ("session_start", "train")}
    missing = [ack for ack in acked if ack not in present]
    assert not missing, f"seed {seed}: acknowledged records missing: {missing[:5]}"

    started = [r["session_id"] for r in records if r["event"] == "session_start"]
    sessions = reader.sessions
    assert [s.session_id for s in sessions] == started, f"seed {seed}: a session was not recognised"
    assert len(started) == len(set(started)) and started[-1] == "final"
    reported = {s.session_id: s.discarded_bytes for s in sessions}
    assert reported == {sid: torn_at_start[sid] for sid in started}, f"seed {seed}: a cut was misreported"
    for before, after in itertools.pairwise(torn_at_start):
        if before not in reported:  # killed before session_start: the tail must wait for the next one
            assert torn_at_start[after] >= torn_at_start[before], f"seed {seed}: {before} cut without reporting"
    assert sum(reported.values()) == sum(torn_at_start[sid] for sid in started)

    cold = RunReader(path)
    cold.refresh()
    assert cold.sessions == sessions, f"seed {seed}: the tailing reader disagrees with a cold read"
    reader.close()
    cold.close()
    print(
        f"crash storm: {CYCLES} kills, {len(started) - 1} sessions wrote session_start, "
        f"{CYCLES - len(started) + 1} were killed before it; {len(acked)} acknowledged records, "
        f"{len(records)} on disk, 0 lost, 0 duplicated; torn tails at restart: {genuine} torn by a kill, "
        f"{injected} injected; {sum(reported.values())} torn bytes, all reported once; "
        f"file {path.stat().st_size / 1e6:.1f} MB"
    )
