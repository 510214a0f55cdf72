"""System metrics in real processes: importing the training side loads neither psutil nor NVML, a
node without the extras logs no sys/ keys, and a real 4-rank gloo job whose records carry every
rank's samples within the window's two collectives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metrics_core.testing.live_server import free_port
from metrics_core.write.system_sampler import GIB
from tests.support import REPO, read_records

psutil = pytest.importorskip("psutil", reason="the system extra (psutil) is not installed")

WORLD = 4
JOIN_TIMEOUT_S = 60


HIDDEN = """
import sys
from pathlib import Path
try:
    import psutil
except ImportError:
    pass
else:
    raise SystemExit("psutil is not hidden")
from metrics_core.write.training_session import training_session
with training_session(sys.argv[1]) as session:
    session.window.add(1.0, 10)
    session.log_window(0.1)
print("ok")
"""


def test_importing_the_training_side_imports_neither_psutil_nor_nvml() -> None:
    """The sampler imports its extras when a session starts one, never at import time."""
    code = (
        "import sys, metrics_core, metrics_core.write.training_session, metrics_core.write.system_sampler,"
        " metrics_core.integrations._common\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'psutil', 'pynvml'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_a_node_without_the_extras_logs_no_sys_keys_and_no_error(tmp_path: Path) -> None:
    """A real interpreter whose path holds every installed package but psutil and pynvml (no site
    processing, so nothing else puts them back): the session runs and writes no ``sys/`` key."""
    site = Path(psutil.__file__).resolve().parent.parent
    hidden = tmp_path / "site"
    hidden.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith(("psutil", "pynvml", "nvidia_ml_py")) and entry.suffix != ".pth":
            (hidden / entry.name).symlink_to(entry)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{hidden}"}
    done = subprocess.run([sys.executable, "-S", "-c", HIDDEN, str(tmp_path / "run")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert [record["event"] for record in records] == ["session_start", "train", "session_end"]
    assert not [key for record in records for key in record if key.startswith("sys/")]


RANKS = """
import json, sys
from datetime import timedelta
from pathlib import Path
rank, world, port, run_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
import torch.distributed as dist
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                        timeout=timedelta(seconds=20))
calls = []
for name in ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce", "barrier", "gather"):
    def spy(*args, _real=getattr(dist, name), _name=name, **kwargs):
        calls.append(_name)
        return _real(*args, **kwargs)
    setattr(dist, name, spy)
from metrics_core.write.training_session import training_session
windows = []
with training_session(run_dir) as session:
    for window in range(2):
        session.window.add(1.0 + rank, 100)
        sample = session.sampler.latest()  # the thread samples every 10 s: the window attaches this one
        rss_kib = int(next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                           if line.startswith("VmRSS:")))
        before = len(calls)
        record = session.log_window(1e-3)
        windows.append({"sample": sample, "rss_kib": rss_kib, "calls": calls[before:], "record": record})
print(json.dumps({"rank": rank, "windows": windows}), flush=True)
dist.destroy_process_group()
"""


def test_four_rank_gloo_records_carry_every_ranks_samples(tmp_path: Path) -> None:
    """Rank 0's records hold ``sys/<field>/rank<N>`` for every rank, each equal to that rank's own
    latest sample (its RSS near its own /proc VmRSS); every rank gets the same ``sys/`` fields; the
    window still issues exactly its two all_reduce."""
    run_dir, port = tmp_path / "run", str(free_port())
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    children = [subprocess.Popen([sys.executable, "-u", "-c", RANKS, str(rank), str(WORLD), port, str(run_dir)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
                for rank in range(WORLD)]  # fmt: skip
    outputs = []
    try:
        for child in children:
            out, err = child.communicate(timeout=JOIN_TIMEOUT_S)
            assert child.returncode == 0, err
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            child.kill()
            child.wait()
    written = [record for record in read_records(run_dir / "metrics.jsonl") if record["event"] == "train"]
    assert len(written) == 2
    for index, record in enumerate(written):
        gathered = {key: value for key, value in record.items() if key.startswith("sys/")}
        assert [{key: output["windows"][index]["record"][key] for key in gathered} for output in outputs] == [
            gathered
        ] * WORLD
        for output in outputs:
            window, rank = output["windows"][index], output["rank"]
            assert window["calls"] == ["all_reduce", "all_reduce"]
            assert window["sample"] and {f"sys/{name}/rank{rank}": value for name, value in
                                         window["sample"].items()}.items() <= record.items()  # fmt: skip
            assert (
                abs(record[f"sys/proc_rss_gib/rank{rank}"] * GIB / 1024 - window["rss_kib"]) < 0.2 * window["rss_kib"]
            )
        assert not [key for key in record if key.startswith("sys/") and "/rank" not in key]
