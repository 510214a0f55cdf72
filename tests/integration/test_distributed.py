"""Windows reduced over a real 4-process gloo group on loopback; rank 0 alone writes; a killed rank fails fast."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metrics_core.testing.live_server import free_port
from tests.support import REPO, read_records

pytest.importorskip("torch", reason="the PyTorch CPU build is not installed (.ci/run: pip install torch==2.13.0)")

WORLD = 4
JOIN_TIMEOUT_S = 45  # hard limit on every wait for the children; leftovers are killed
GROUP_TIMEOUT_S = 10  # the process group's own timeout for a collective

# Inputs of every rank, shared by the children (exec'd there) and by the oracle below.
DATA = '''
import math

def attempt(rank, window, i):
    """(loss, tokens, grad_norm, skipped): ranks differ in tokens per batch and in loss."""
    skipped = window == 1 and i == 2
    loss = 1.0 + 0.5 * rank + 0.1 * window + 0.01 * i
    tokens = 100 * (rank + 1) + 7 * i
    if skipped:
        norm = math.inf
    elif (window, i) == (0, 4):  # every rank, as under DDP where ranks share the norm
        norm = math.nan
    else:
        norm = 0.2 + 0.3 * rank + 0.05 * i + 0.01 * window
    return loss, tokens, norm, skipped

def attempts_in(rank, window):
    return 7 if (rank, window) == (1, 2) else 6  # in the last window rank 1 runs one attempt ahead
'''
_shared: dict = {}
exec(DATA, _shared)  # the same functions for the oracle
attempt, attempts_in = _shared["attempt"], _shared["attempts_in"]

PRELUDE = """
import json, os, sys, time
from datetime import timedelta
rank, world, port, run_dir, scenario = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
touched = []
if rank != 0:
    def audit(event, args):
        if event in ("open", "os.mkdir") and isinstance(args[0], str) and args[0].startswith(run_dir):
            touched.append([event, args[0]])
    sys.addaudithook(audit)
import torch
import torch.distributed as dist
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                        timeout=timedelta(seconds=GROUP_TIMEOUT_S))
calls = []  # every collective this process issues, by name (the spy: test code only)
for name in ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce", "reduce_scatter",
             "barrier", "all_to_all", "gather", "scatter", "all_gather_object", "broadcast_object_list"):
    def spy(*args, _real=getattr(dist, name), _name=name, **kwargs):
        calls.append(_name)
        return _real(*args, **kwargs)
    setattr(dist, name, spy)
from metrics_core.write.training_session import training_session
""".replace("GROUP_TIMEOUT_S", str(GROUP_TIMEOUT_S))

WINDOWS = """
windows = []
with training_session(run_dir, config={"lr": 0.1, "world": world}) as session:
    for window in range(3):
        before = len(calls)
        for i in range(attempts_in(rank, window)):
            loss, tokens, norm, skipped = attempt(rank, window, i)
            if rank % 2 == 0:  # even ranks pass 0-d tensors (the device path), odd ranks floats
                loss, norm = torch.tensor(loss, dtype=torch.float64), torch.tensor(norm, dtype=torch.float64)
                skipped = torch.tensor(skipped)
            session.window.add(loss, tokens, norm, skipped, 1.0)
            if rank == world - 1:
                time.sleep(0.03)  # the straggler
        in_adds = calls[before:]
        record = session.log_window(1e-3)
        windows.append({"in_adds": in_adds, "in_log_window": calls[before + len(in_adds):], "record": record})
    state = [session.state.step, session.state.tokens_seen, session.state.skipped_updates]
    print(json.dumps({"rank": rank, "writes": session.writes, "windows": windows, "state": state,
                      "touched": touched, "session": [session.rank, session.world_size]}), flush=True)
dist.destroy_process_group()
"""

KILLED = """
with training_session(run_dir) as session:
    for window in range(100000):
        for i in range(3):
            session.window.add(1.0 + rank, 100, 0.5, False, 1.0)
        session.log_window(1e-3)
        if rank == 0:
            print("window", window, flush=True)
        time.sleep(0.02)
"""


def spawn_ranks(body: str, run_dir: Path) -> list[subprocess.Popen]:
    """Start WORLD real processes, torchrun-style, rendezvous over loopback only."""
    port = str(free_port())
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    code = DATA + PRELUDE + body
    return [
        subprocess.Popen(
            [sys.executable, "-u", "-c", code, str(rank), str(WORLD), port, str(run_dir), "run"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for rank in range(WORLD)
    ]


def join_all(children: list[subprocess.Popen], deadline: float) -> list[tuple[int | None, str, str]]:
    """Wait for every child until ``deadline``; kill any still running; return (status, out, err)."""
    results = []
    try:
        for child in children:
            try:
                out, err = child.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                out, err = child.communicate()
                err += "\n[killed by the test: still running at the deadline]"
            results.append((child.returncode, out, err))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return results


def oracle(window: int) -> dict:
    """The global window computed directly from every rank's attempts."""
    rows = [(rank, *attempt(rank, window, i)) for rank in range(WORLD) for i in range(attempts_in(rank, window))]
    tokens = sum(row[2] for row in rows)
    norms = [row[3] for row in rows if not row[4] and math.isfinite(row[3])]
    per_rank = {
        name: [sum(1 for row in rows if row[0] == rank and test(row)) for rank in range(WORLD)]
        for name, test in (
            ("attempts", lambda row: True),
            ("updates", lambda row: not row[4]),
            ("skips", lambda row: row[4]),
            ("nonfinite", lambda row: not row[4] and not math.isfinite(row[3])),
        )
    }
    return {
        "train_loss": sum(row[1] * row[2] for row in rows) / tokens,
        "tokens": tokens,
        "attempted_updates": max(per_rank["attempts"]),
        "updates": max(per_rank["updates"]),
        "skipped_updates_in_window": max(per_rank["skips"]),
        "nonfinite_grad_norms": max(per_rank["nonfinite"]),
        "grad_norm_avg": sum(norms) / len(norms),
        "grad_norm_max": max(norms),
        "clipped_fraction": sum(norm > 1.0 for norm in norms) / sum(per_rank["updates"]),
        "ranks_in_lockstep": all(len(set(counts)) == 1 for counts in per_rank.values()),
        "world_size": WORLD,
    }


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real 4-rank run of three windows; every rank's report and rank 0's file."""
    run_dir = tmp_path_factory.mktemp("dist") / "run"
    children = spawn_ranks(WINDOWS, run_dir)
    results = join_all(children, time.monotonic() + JOIN_TIMEOUT_S)
    for rank, (status, _, err) in enumerate(results):
        assert status == 0, f"rank {rank} exited {status}:\n{err[-3000:]}"
    reports = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in results]
    return {"dir": run_dir, "reports": reports, "pids": [child.pid for child in children]}


def test_logged_window_is_the_global_token_weighted_window(four_ranks: dict) -> None:
    """train_loss over every rank's tokens; counts per optimizer step; grad avg/max and clipping exact."""
    train = [r for r in read_records(four_ranks["dir"] / "metrics.jsonl") if r["event"] == "train"]
    assert len(train) == 3
    for window, record in enumerate(train):
        expected = oracle(window)
        for key, value in expected.items():
            assert record[key] == pytest.approx(value, rel=1e-12), (window, key)
        assert record["lr"] == 1e-3
    assert [r["ranks_in_lockstep"] for r in train] == [True, True, False]  # rank 1 ran ahead in the last
    # The loss rank 0 alone would have logged is far off the global one: the bug this fixes.
    rank_0 = [attempt(0, 0, i) for i in range(6)]
    alone = sum(loss * tokens for loss, tokens, *_ in rank_0) / sum(tokens for _, tokens, *_ in rank_0)
    assert abs(train[0]["train_loss"] - alone) > 0.5


def test_every_rank_gets_the_same_record_and_counters(four_ranks: dict) -> None:
    """All ranks compute the identical global summary and advance their state identically."""
    reports = four_ranks["reports"]
    strip = ("time", "session_id")
    records = [[{k: v for k, v in w["record"].items() if k not in strip} for w in r["windows"]] for r in reports]
    assert all(other == records[0] for other in records[1:])
    assert all(r["state"] == reports[0]["state"] for r in reports)
    step = sum(oracle(w)["updates"] for w in range(3))
    assert reports[0]["state"][0] == step
    assert [r["session"] for r in reports] == [[rank, WORLD] for rank in range(WORLD)]


def test_two_collectives_per_window_none_per_add(four_ranks: dict) -> None:
    """The spy sees no collective during add() and exactly one SUM + one MAX all_reduce per window."""
    for report in four_ranks["reports"]:
        for window in report["windows"]:
            assert window["in_adds"] == []
            assert window["in_log_window"] == ["all_reduce", "all_reduce"]


def test_only_rank_0_touches_the_run_directory(four_ranks: dict) -> None:
    """Ranks ≠ 0 never create or open anything in the run directory; the file holds rank 0's session only."""
    reports = four_ranks["reports"]
    assert [r["writes"] for r in reports] == [True, False, False, False]
    assert all(r["touched"] == [] for r in reports[1:])
    records = read_records(four_ranks["dir"] / "metrics.jsonl")
    assert [r["event"] for r in records] == ["session_start", "config", "train", "train", "train", "session_end"]
    assert {r["session_id"] for r in records} == {records[0]["session_id"]}
    assert records[0]["session_id"].endswith(f"-{four_ranks['pids'][0]}")
    assert (records[0]["rank"], records[0]["world_size"]) == (0, WORLD)
    assert records[1]["config"] == {"lr": 0.1, "world": WORLD}
    assert records[-1]["status"] == "finished"


def test_per_rank_health_names_the_straggler(four_ranks: dict) -> None:
    """Rank 3 sleeps 30 ms per attempt: it is the slowest rank, and the spread is recorded."""
    train = [r for r in read_records(four_ranks["dir"] / "metrics.jsonl") if r["event"] == "train"]
    for record in train:
        assert record["slowest_rank"] == WORLD - 1
        assert record["rank_step_time_max_s"] >= 0.02 > record["rank_step_time_min_s"] > 0
        assert 0 < record["rank_tokens_per_s_min"] < record["rank_tokens_per_s_max"]


def test_killed_rank_fails_rank_0_within_the_group_timeout(tmp_path: Path) -> None:
    """SIGKILL of rank 2 mid-run: rank 0 ends its session failed, naming the reduction, within bounded time."""
    run_dir = tmp_path / "run"
    children = spawn_ranks(KILLED, run_dir)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        while True:
            line = children[0].stdout.readline()
            assert line, f"rank 0 ended before training:\n{children[0].stderr.read()[-3000:]}"
            if line.startswith("window 2"):
                break
        children[2].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        status, _, err = join_all(children[:1], deadline)[0]
        failed_after = time.monotonic() - killed
    finally:
        join_all(children, min(deadline, time.monotonic() + 5))
    assert status == 1 and "WindowReductionError" in err
    assert failed_after < GROUP_TIMEOUT_S + 10
    end = read_records(run_dir / "metrics.jsonl")[-1]
    assert (end["event"], end["status"]) == ("session_end", "failed")
    assert end["error"].startswith("WindowReductionError: reducing the training window across 4 ranks failed")


# A plain training script, as a user writes it for torchrun: no @record, nothing but the session.
TORCHRUN_SCRIPT = """
import sys, time
import torch.distributed as dist
from metrics_core.write.training_session import training_session

dist.init_process_group("gloo")
rank = dist.get_rank()
with training_session(sys.argv[1]) as session:
    for window in range(100000):
        for i in range(3):
            session.window.add(1.0 + rank, 100, 0.5, False, 1.0)
        if rank == 2 and window == 3:
            raise ValueError("rank 2 broke at window 3")
        session.log_window(1e-3)
        time.sleep(0.01)
"""


def test_a_rank_that_raises_under_torchrun_is_named_in_the_session_end(tmp_path: Path) -> None:
    """torchrun, rank 2 raises: the run ends failed with rank 2's exception, not the survivors' SIGTERM/gloo error."""
    from metrics_core.read.run_digest import RunDigest
    from metrics_core.read.run_status import run_status

    script, run_dir = tmp_path / "train.py", tmp_path / "run"
    script.write_text(TORCHRUN_SCRIPT)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD),
                "--master_addr", "127.0.0.1", "--master_port", str(free_port())]  # fmt: skip
    done = subprocess.run([*launcher, str(script), str(run_dir)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=JOIN_TIMEOUT_S * 4)  # fmt: skip
    assert done.returncode != 0 and "ValueError: rank 2 broke at window 3" in done.stderr
    end = read_records(run_dir / "metrics.jsonl")[-1]
    assert (end["event"], end["status"], end["failed_rank"]) == ("session_end", "failed", 2), end
    assert end["error"] == "rank 2: ValueError: rank 2 broke at window 3"
    assert end["rank_0_error"] == "SIGTERM" or end["rank_0_error"].startswith("WindowReductionError: ")
    digest = RunDigest(run_dir)
    digest.refresh()
    assert run_status(digest, now=digest.last_record_time) == "failed"
    assert digest.sessions[-1].end_status == "failed"


RANK_0_ENDS = """
import os, signal, sys
from datetime import datetime, timezone
from pathlib import Path
import torch.distributed as dist
from metrics_core import RecordValueError
from metrics_core.write.distributed import RankFailure, leave_rank_failure
from metrics_core.write.training_session import training_session

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0, world_size=1)
run = Path(sys.argv[1])
for cause, noted in ((lambda: os.kill(os.getpid(), signal.SIGTERM), "ValueError: rank 2 broke"),
                     (lambda: (_ for _ in ()).throw(RecordValueError("'train_loss' is nan")),
                      "RecordValueError: 'train_loss' is nan")):
    try:
        with training_session(run) as session:
            leave_rank_failure(run, RankFailure(2, 4, datetime.now(timezone.utc), noted))
            cause()
    except (SystemExit, RecordValueError):
        pass
dist.destroy_process_group()
"""


def test_rank_0_ends_with_a_ranks_failure_but_keeps_a_failure_every_rank_shares(tmp_path: Path) -> None:
    """Rank 0 SIGTERMed after rank 2 failed: rank 2's error; the same refused record on every rank: rank 0's own."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    run_dir = tmp_path / "run"
    subprocess.run([sys.executable, "-c", RANK_0_ENDS, str(run_dir), str(free_port())], env=env, check=True,
                   timeout=JOIN_TIMEOUT_S * 2)  # fmt: skip
    ends = [r for r in read_records(run_dir / "metrics.jsonl") if r["event"] == "session_end"]
    assert [(end["status"], end["error"], end.get("failed_rank"), end.get("rank_0_error")) for end in ends] == [
        ("failed", "rank 2: ValueError: rank 2 broke", 2, "SIGTERM"),
        ("failed", "RecordValueError: 'train_loss' is nan", None, None),
    ]


def test_importing_the_distributed_code_does_not_import_torch() -> None:
    """metrics_core, its session and distributed modules load without torch."""
    code = (
        "import sys, metrics_core, metrics_core.write.training_session, metrics_core.write.distributed; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"
