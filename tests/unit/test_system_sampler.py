"""System metrics in this process: psutil samples against /proc, NVML where a GPU is, sys/ keys
written by a training session (or not), one chart a key with a line per rank."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metrics_core.dashboard.figures.run_charts import run_charts
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.views.chart_specs import ChartOptions, logged_charts
from metrics_core.integrations._common import RunSession
from metrics_core.write.system_sampler import FIELDS, GIB, start_sampler
from metrics_core.write.training_session import training_session
from tests.support import append_records, base_record, read_records


def proc_kib(path: str, *names: str) -> dict[str, int]:
    """``name: value`` of the ``kB`` lines of a /proc file (``VmRSS``, ``MemTotal``, ...)."""
    found = {}
    for line in Path(path).read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in names:
            found[name] = int(rest.split()[0])
    return found


def test_psutil_sample_agrees_with_proc() -> None:
    """RSS against /proc/self/status, host memory in use against /proc/meminfo; CPU percentages
    appear from the second sample on, within 0..100; close() stops the thread."""
    sampler = start_sampler(interval=0.05, gpu=False)
    assert sampler is not None
    try:
        first = sampler.latest()
        rss_kib = proc_kib("/proc/self/status", "VmRSS")["VmRSS"]
        meminfo = proc_kib("/proc/meminfo", "MemTotal", "MemAvailable")
        deadline = time.monotonic() + 10
        while "host_cpu_percent" not in sampler.latest() and time.monotonic() < deadline:
            time.sleep(0.02)
        later = sampler.latest()
    finally:
        sampler.close()
    assert "host_cpu_percent" not in first and "proc_cpu_percent" not in first  # no interval yet
    assert abs(first["proc_rss_gib"] * GIB / 1024 - rss_kib) < 0.2 * rss_kib
    used_kib = meminfo["MemTotal"] - meminfo["MemAvailable"]
    assert abs(first["host_mem_used_gib"] * GIB / 1024 - used_kib) < 0.1 * meminfo["MemTotal"]
    assert 0 < first["host_mem_percent"] < 100
    assert 0 <= later["host_cpu_percent"] <= 100 and later["proc_cpu_percent"] >= 0
    assert not any(name.startswith("gpu_") for name in later) and set(later) <= set(FIELDS)
    assert not sampler._thread.is_alive()


def test_nvml_sample_where_a_gpu_is() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (the system extra's GPU part) is not installed")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA driver or GPU here: {exc}")
    sampler = start_sampler(interval=60.0)
    assert sampler is not None
    try:
        sample = sampler.latest()
    finally:
        sampler.close()
    assert 0 <= sample["gpu_util_percent"] <= 100 and 0 <= sample["gpu_mem_percent"] <= 100
    assert sample["gpu_mem_used_gib"] > 0 and 0 < sample["gpu_temp_c"] < 120
    assert sample.get("gpu_power_w", 1.0) > 0  # some boards do not report power


def one_window(directory: Path, **options: object) -> dict:
    with training_session(directory, **options) as session:
        session.window.add(1.0, 10)
        session.log_window(0.1)
    (record,) = [record for record in read_records(directory / "metrics.jsonl") if record["event"] == "train"]
    return record


def test_training_session_writes_sys_keys_and_system_metrics_false_writes_none(tmp_path: Path) -> None:
    on = one_window(tmp_path / "on")
    off = one_window(tmp_path / "off", system_metrics=False)
    assert {"sys/host_mem_used_gib", "sys/host_mem_percent", "sys/proc_rss_gib"} <= set(on)
    assert not [key for key in off if key.startswith("sys/")]
    assert off["train_loss"] == on["train_loss"] == 1.0


def test_per_rank_keys_share_one_chart_a_line_per_rank(tmp_path: Path) -> None:
    """``sys/<field>/rank<N>`` keys chart as one ``sys/<field>`` chart under "sys", a line per rank
    in rank order; a single process's ``sys/<field>`` is a chart of its own."""
    ranks = {f"sys/proc_rss_gib/rank{rank}": 0.5 + rank for rank in (0, 2, 10, 1)}
    records = [base_record(step, train_loss=1.0, **ranks, **{"sys/host_mem_percent": 3.0}) for step in (1, 2)]
    append_records(tmp_path / "run" / "metrics.jsonl", *records)
    store = RunStore(tmp_path)
    try:
        charts = {chart.key: chart for chart in logged_charts(store.view("run"))}
        figure = run_charts(store.view("run"), ChartOptions())["key:sys/proc_rss_gib"]
    finally:
        store.close()
    assert set(charts) == {"key:sys/proc_rss_gib", "key:sys/host_mem_percent"}
    rss = charts["key:sys/proc_rss_gib"]
    assert rss.group == "sys" and rss.title == "sys/proc_rss_gib"
    assert [(line.label, line.column) for line in rss.lines] == [
        (f"rank {rank}", f"sys/proc_rss_gib/rank{rank}") for rank in (0, 1, 2, 10)
    ]
    assert [line.column for line in charts["key:sys/host_mem_percent"].lines] == ["sys/host_mem_percent"]
    drawn = {trace["name"]: list(trace["y"]) for trace in figure["data"] if trace["name"].endswith(" · S1")}
    assert drawn == {f"rank {rank} · S1": [pytest.approx(0.5 + rank)] * 2 for rank in (0, 1, 2, 10)}


def test_framework_integrations_run_session_samples_unless_told_not_to(tmp_path: Path) -> None:
    """The HF callback and the Lightning logger write through ``RunSession``: its ``train`` records
    carry the sample, ``system_metrics=False`` none, and ``end()`` stops the sampler."""
    for name, enabled in (("on", True), ("off", False)):
        run = RunSession(tmp_path / name, system_metrics=enabled)
        run.start(None)
        sampler = run.sampler
        run.write("train", train_loss=1.0)
        run.write("validation", val_loss=1.0)
        run.end()
        assert (sampler is not None) is enabled and (sampler is None or not sampler._thread.is_alive())
    on, off = (read_records(tmp_path / name / "metrics.jsonl") for name in ("on", "off"))
    assert [bool([k for k in record if k.startswith("sys/")]) for record in on] == [False, True, False, False]
    assert not [key for record in off for key in record if key.startswith("sys/")]
