"""System metrics (host CPU and memory, process RSS, GPU utilisation, memory, temperature, power),
sampled off the training loop and attached to each ``train`` record as ``sys/…`` keys.

Why a thread: reading NVML and ``/proc`` costs around a millisecond, and a training step must pay
nothing for it.  ``SystemSampler`` takes one sample when it starts (so the first window already
has one), then one every ``interval`` seconds on a daemon thread; the window only reads the latest
sample, a dict lookup under a lock — no I/O, no device sync in the step.

Contract
--------
* **Optional.** ``psutil`` (host and process) and ``nvidia-ml-py`` (GPU) are the ``system`` extra
  (``pip install metrics-core[system]``), imported only when a sampler starts, never by
  ``import metrics_core``.  ``start_sampler`` returns None without psutil; without NVML, or
  without a GPU, samples have no ``gpu_*`` fields.  Neither is an error: such a node logs no
  ``sys/`` keys (or no ``sys/gpu_*`` ones).
* **Fields** (``FIELDS``, in this order, the layout the data-parallel window gathers): a field
  that could not be read is absent from the sample.  Memory is in GiB (2**30 bytes).
  ``host_cpu_percent`` and ``proc_cpu_percent`` are averages since the previous sample, so the
  first sample has neither.  The GPU is the one NVML numbers ``LOCAL_RANK`` (0 without it),
  mapped through ``CUDA_VISIBLE_DEVICES`` when that lists indices.
* **Keys** (``system_keys``): ``sys/<field>`` in a single process, ``sys/<field>/rank<N>`` (global
  rank) under a process group, one key per rank, so the dashboard draws one chart per field
  with a line per rank (``chart_specs.logged_charts``).
* **Lifetime.** ``close()`` stops the thread and releases NVML; the thread is a daemon, so a
  process that never closes it still exits.  A sampler that fails to read (a GPU that fell off
  the bus) keeps its last good fields and goes on; it never raises into training.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

FIELDS = (
    "host_cpu_percent",
    "host_mem_used_gib",
    "host_mem_percent",
    "proc_rss_gib",
    "proc_cpu_percent",
    "gpu_util_percent",
    "gpu_mem_used_gib",
    "gpu_mem_percent",
    "gpu_temp_c",
    "gpu_power_w",
)
DEFAULT_INTERVAL_S = 10.0
GIB = float(2**30)


def system_keys(sample: Mapping[str, float], rank: int | None = None) -> dict[str, float]:
    """``sample`` as record fields: ``sys/<field>``, or ``sys/<field>/rank<rank>`` for a rank."""
    suffix = "" if rank is None else f"/rank{rank}"
    return {f"sys/{name}{suffix}": value for name, value in sample.items() if math.isfinite(value)}


def _nvml_index() -> int:
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    visible = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    if local < len(visible) and visible[local].isdigit():
        return int(visible[local])
    return local


class _Nvml:
    """One GPU through NVML; construction raises when NVML or the GPU is not there."""

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index())
        except BaseException:
            pynvml.nvmlShutdown()
            raise
        self.nvml = pynvml

    def read(self, sample: dict[str, float]) -> None:
        nvml, handle = self.nvml, self.handle
        reads: tuple[tuple[str, Callable[[], float]], ...] = (
            ("gpu_util_percent", lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            ("gpu_temp_c", lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            ("gpu_power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),  # milliwatts
        )
        for name, read in reads:
            with contextlib.suppress(nvml.NVMLError):
                sample[name] = read()
        with contextlib.suppress(nvml.NVMLError):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            sample["gpu_mem_used_gib"] = memory.used / GIB
            sample["gpu_mem_percent"] = 100.0 * memory.used / memory.total if memory.total else math.nan

    def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


class SystemSampler:
    """Samples this host, process and GPU every ``interval`` seconds on a daemon thread.

    Built by ``start_sampler``; ``psutil`` is the module (passed in so that only the caller
    decides whether the extra is there).
    """

    def __init__(self, psutil: Any, *, interval: float = DEFAULT_INTERVAL_S, gpu: bool = True) -> None:
        self.interval = interval
        self._psutil = psutil
        self._process = psutil.Process()
        self._gpu = None
        if gpu:
            with contextlib.suppress(Exception):  # no nvidia-ml-py, no driver, no GPU: no gpu_* fields
                self._gpu = _Nvml()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._latest: dict[str, float] = {}
        self._primed = False
        self._sample()
        self._thread = threading.Thread(target=self._run, name="metrics-system-sampler", daemon=True)
        self._thread.start()

    def latest(self) -> dict[str, float]:
        """The latest sample (a copy): what a window attaches.  Cheap: no I/O."""
        with self._lock:
            return dict(self._latest)

    def close(self) -> None:
        """Stop the thread (waits at most one sample's time) and release NVML."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        psutil = self._psutil
        sample: dict[str, float] = {}
        with contextlib.suppress(Exception):  # never raise into training: keep what was read
            host_cpu = psutil.cpu_percent(interval=None)  # since the previous call; the first has none
            proc_cpu = self._process.cpu_percent(interval=None)
            if self._primed:
                sample["host_cpu_percent"] = float(host_cpu)
                sample["proc_cpu_percent"] = float(proc_cpu)
            self._primed = True
            memory = psutil.virtual_memory()
            sample["host_mem_used_gib"] = (memory.total - memory.available) / GIB
            sample["host_mem_percent"] = float(memory.percent)
            sample["proc_rss_gib"] = self._process.memory_info().rss / GIB
        if self._gpu is not None:
            self._gpu.read(sample)
        with self._lock:
            self._latest = {**self._latest, **sample}


def start_sampler(*, interval: float = DEFAULT_INTERVAL_S, gpu: bool = True) -> SystemSampler | None:
    """A running ``SystemSampler``, or None when ``psutil`` (the ``system`` extra) is not installed."""
    try:
        import psutil
    except ImportError:
        return None
    return SystemSampler(psutil, interval=interval, gpu=gpu)
