"""Training windows of a data-parallel job, reduced over its ``torch.distributed`` process group.

Why: each data-parallel rank sees 1/world_size of the batches.  A log written by rank 0 from its
own window reports a loss over the wrong set of batches — the "loss that looks too good" of the
field story.  ``DistributedWindow`` is a ``TrainingWindow`` whose ``summary()`` reduces the
window over the process group first, so rank 0 writes the job's numbers.

Contract
--------
* **Collective.** ``summary()`` (and so ``TrainingSession.log_window``) is a collective: every rank
  of the group must call it at the same point of the loop, the same number of times.  A rank that
  does not leaves the others waiting in it until the process group's ``timeout``; then, like a
  rank that died, it surfaces as ``WindowReductionError`` on the waiting ranks.
* **Cost.** Exactly two ``all_reduce`` per window, issued together and waited on together: one SUM
  of a packed float64 vector (the window's sums and each rank's timing in its own slot), one MAX
  (grad-norm max and the per-rank counts).  None per ``add()``, which stays a host-only append;
  the single host transfer of the window happens after the collectives (a device sync on GPU).
  Sums of integers are exact in float64 up to 2**53.
* **Device.** NCCL reduces tensors on the rank's current CUDA device (``torch.cuda.set_device``);
  gloo and MPI on the CPU; a mixed backend (``cpu:gloo,cuda:nccl``) where the window's tensors
  are.  ``device=`` overrides.
* **Semantics.** ``tokens`` is the sum over ranks and ``train_loss`` the mean over every rank's
  tokens.  Ranks of a data-parallel job take the *same* optimizer steps, so ``attempted_updates``,
  ``updates``, ``skipped_updates_in_window`` and ``nonfinite_grad_norms`` are per-step counts,
  reduced by MAX — summing would make ``step`` run world_size times too fast and break resuming
  from a checkpoint's step.  Whether every rank agreed is recorded in ``ranks_in_lockstep``
  (SUM == world_size × MAX for each count).  ``grad_norm_avg`` is over every rank's successful
  updates, ``grad_norm_max`` a MAX, ``clipped_fraction`` the summed clipped over the summed updates.
* **Non-finite loss after the collective.** A NaN tensor loss on any rank makes the global sum NaN,
  so every rank reports the same ``train_loss`` None and ``nonfinite_loss`` True after the
  reduction, and none is left waiting.
* **System samples** (also in the SUM, one block of ``metrics_core.write.system_sampler.FIELDS`` per rank, when
  the session samples): every rank's latest sample reaches rank 0's record as
  ``sys/<field>/rank<N>`` without a collective of its own.  A rank's field it could not read is
  NaN in its block and no key in the record.
* **Per-rank health** (also in the SUM, one slot per rank): each rank's time per attempt and
  tokens/s, from ``time.monotonic`` on the host at the window's start and at ``summary()`` entry —
  no device sync.  The window starts at ``reset()`` (the previous ``summary``), or for a fresh
  window at its first ``add()``, so the first window of a session misses one attempt's time.
  Caveat: a job that synchronises every step (DDP's gradient all-reduce blocking the host) runs
  every rank at the slowest one's pace, so wall times converge; what differs then is the host
  work between synchronisations and the tokens per rank.
* **Groups.** ``group=None`` is the default (world) group.  With tensor or pipeline parallelism
  pass the data-parallel group: its ranks must see different batches, or tokens count twice.
  ``slowest_rank`` is always a global rank.
* **A rank's failure is named.**  When one rank raises, the others only see the symptom: the
  launcher's SIGTERM (``torchrun`` stops every worker once one has exited) or a broken
  collective.  So a rank other than 0 whose session fails leaves a rank failure note beside the
  metrics file (``.metrics.rank-<rank>.failure``: ``rank``, ``world_size``, ``time``, ``error``),
  written before its process exits and so before any other rank can notice the death; rank 0,
  ending its session on anything but success, ends it ``failed`` with the earliest note written
  since its own process started (older notes are a previous job's).  Needs the run directory on
  a filesystem every rank sees (always true on one node); elsewhere the note is simply not found.

Nothing here is imported by ``import metrics_core``; torch is imported only by ``DistributedWindow``
methods and by ``process_group_rank`` once the caller has imported ``torch.distributed``.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from metrics_core.errors import WindowReductionError
from metrics_core.write.system_sampler import FIELDS as SYSTEM_FIELDS
from metrics_core.write.system_sampler import system_keys
from metrics_core.write.window import TrainingWindow, WindowTotals
from metrics_core.write.writer import MetricsWriter, RunContext, config_value

# Layout of the SUM vector: these sums, then world_size time-per-attempt slots, then world_size
# tokens/s slots (each rank writes its own slot, every other slot is 0.0, so the SUM gathers them).
SUM_FIELDS = (
    "loss_sum",
    "tokens",
    "attempts",
    "updates",
    "skips",
    "grad_norms",
    "grad_norm_sum",
    "nonfinite",
    "clipped",
)
# Layout of the MAX vector.
MAX_FIELDS = ("grad_norm_max", "attempts", "updates", "skips", "nonfinite")
_COUNTS = ("attempts", "updates", "skips", "nonfinite")
# Hidden, so run discovery ignores it; one per failed rank, the latest failure of that rank.
RANK_FAILURE_GLOB = ".metrics.rank-*.failure"


def process_group_rank() -> tuple[int, int] | None:
    """``(global rank, world size)`` when a default process group is initialised, else ``None``.

    Never imports torch: a process group exists only if the caller imported ``torch.distributed``.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


@dataclass(frozen=True, slots=True)
class RankHealth:
    """The spread of per-rank speed in one window (``None`` where no rank had an attempt)."""

    world_size: int
    slowest_rank: int | None
    step_time_min_s: float | None
    step_time_max_s: float | None
    tokens_per_s_min: float | None
    tokens_per_s_max: float | None

    def fields(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "slowest_rank": self.slowest_rank,
            "rank_step_time_min_s": self.step_time_min_s,
            "rank_step_time_max_s": self.step_time_max_s,
            "rank_tokens_per_s_min": self.tokens_per_s_min,
            "rank_tokens_per_s_max": self.tokens_per_s_max,
        }


def rank_health(step_times: list[float], tokens_per_s: list[float], global_rank: Callable[[int], int]) -> RankHealth:
    """Slowest rank = longest time per attempt (the lowest rank on a tie); NaN slots had no attempt."""
    timed = [(seconds, rank) for rank, seconds in enumerate(step_times) if math.isfinite(seconds)]
    rates = [rate for rate in tokens_per_s if math.isfinite(rate)]
    if not timed:
        return RankHealth(len(step_times), None, None, None, None, None)
    slowest_time, slowest = max(timed, key=lambda item: (item[0], -item[1]))
    return RankHealth(
        world_size=len(step_times),
        slowest_rank=global_rank(slowest),
        step_time_min_s=min(seconds for seconds, _ in timed),
        step_time_max_s=slowest_time,
        tokens_per_s_min=min(rates) if rates else None,
        tokens_per_s_max=max(rates) if rates else None,
    )


@dataclass
class DistributedWindow(TrainingWindow):
    """A ``TrainingWindow`` whose ``summary()`` is a collective over ``group``; see the module docstring."""

    group: Any = field(default=None, repr=False, compare=False)
    device: Any = field(default=None, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    _started: float | None = field(default=None, repr=False, compare=False)

    def add(
        self,
        loss: Any,
        tokens: int,
        grad_norm: Any = None,
        skipped: Any = False,
        max_grad_norm: float | None = None,
    ) -> None:
        """``TrainingWindow.add``, plus the host clock reading that starts a fresh window."""
        super().add(loss, tokens, grad_norm, skipped, max_grad_norm)
        if self._started is None:
            self._started = self.clock()

    def reset(self) -> None:
        """Start a new window now; the group, device and clock are kept."""
        group, device, clock = self.group, self.device, self.clock
        super().reset()
        self.group, self.device, self.clock = group, device, clock
        self._started = clock()

    def _collective_device(self, torch: Any, dist: Any) -> Any:
        if self.device is not None:
            return torch.device(self.device)
        backend = str(dist.get_backend(self.group)).lower()
        on_cuda = self._device_attempts is not None and self._device_attempts.device.type == "cuda"
        if "nccl" in backend and ("gloo" not in backend or on_cuda):
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def summary(self, lr: float | None = None, *, system: Mapping[str, float] | None = None) -> dict[str, Any]:
        """The global window as ``train`` record fields, plus the per-rank health fields.

        A collective: every rank of the group must call it at the same point (module docstring).
        ``system`` is this rank's latest system sample (``metrics_core.write.system_sampler``), gathered in the
        same SUM as every rank's ``sys/<field>/rank<N>``; pass it (``{}`` on a rank without
        one) on every rank or on none, since it sets the reduced vector's length.
        """
        elapsed = self.clock() - self._started if self._started is not None else math.nan
        import torch
        import torch.distributed as dist

        size, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        device = self._collective_device(torch, dist)
        host = self.host_totals()
        values = [float(getattr(host, name)) for name in SUM_FIELDS] + [0.0] * (2 * size)
        timed = host.attempts > 0 and elapsed > 0
        values[len(SUM_FIELDS) + rank] = elapsed / host.attempts if timed else math.nan
        values[len(SUM_FIELDS) + size + rank] = host.tokens / elapsed if timed else math.nan
        if system is not None:  # this rank's block of SYSTEM_FIELDS slots; NaN is a field it has not
            values += [0.0] * (len(SYSTEM_FIELDS) * size)
            start = len(values) - len(SYSTEM_FIELDS) * (size - rank)
            values[start : start + len(SYSTEM_FIELDS)] = [system.get(name, math.nan) for name in SYSTEM_FIELDS]
        f64 = torch.float64
        sums = torch.tensor(values, dtype=f64, device=device)
        if self._device_attempts is None:
            maxima = torch.tensor(
                [host.grad_norm_max, *(values[SUM_FIELDS.index(name)] for name in _COUNTS)], dtype=f64, device=device
            )
        else:
            folded = self._device_attempts.fold_tensor().to(device)  # FOLD_NAMES order
            sums[0] += folded[0]
            sums[3:9] += folded[1:7]
            local_max = torch.maximum(folded[7], torch.tensor(host.grad_norm_max, dtype=f64, device=device))
            maxima = torch.cat([local_max.reshape(1), sums[[SUM_FIELDS.index(name) for name in _COUNTS]]])
        try:
            sum_work = dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            max_work = dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
            sum_work.wait()
            max_work.wait()
            reduced = torch.cat([sums, maxima]).tolist()  # the window's one host transfer (a sync on GPU)
        except Exception as exc:  # gloo/NCCL raise RuntimeError subclasses (DistBackendError, timeouts)
            raise WindowReductionError(
                f"reducing the training window across {size} ranks failed on rank {rank}: a rank died, hangs, "
                f"or did not call log_window()/summary() at this point ({type(exc).__name__}: {exc})"[:2000]
            ) from exc
        gathered = reduced[len(values) - len(SYSTEM_FIELDS) * size : len(values)] if system is not None else []
        return {
            **self._record(lr, reduced[: len(SUM_FIELDS) + 2 * size] + reduced[len(values) :], size),
            **self._system_keys(gathered, size),
        }

    def _global_rank(self) -> Callable[[int], int]:
        if self.group is None:
            return int
        import torch.distributed as dist

        def global_rank(group_rank: int) -> int:
            return dist.get_global_rank(self.group, group_rank)

        return global_rank

    def _system_keys(self, gathered: list[float], size: int) -> dict[str, float]:
        """Every rank's block of the gathered system samples as ``sys/<field>/rank<N>`` keys."""
        width, global_rank, keys = len(SYSTEM_FIELDS), self._global_rank(), {}
        for rank in range(size if gathered else 0):
            sample = dict(zip(SYSTEM_FIELDS, gathered[rank * width : (rank + 1) * width], strict=True))
            keys.update(system_keys(sample, global_rank(rank)))
        return keys

    def _record(self, lr: float | None, reduced: list[float], size: int) -> dict[str, Any]:
        count = len(SUM_FIELDS)
        total = dict(zip(SUM_FIELDS, reduced[:count], strict=True))
        maximum = dict(zip(MAX_FIELDS, reduced[count + 2 * size :], strict=True))
        per_step = {name: int(maximum[name]) for name in _COUNTS}
        totals = WindowTotals(
            loss_sum=total["loss_sum"],
            tokens=int(total["tokens"]),
            attempts=per_step["attempts"],
            updates=per_step["updates"],
            skips=per_step["skips"],
            grad_norms=int(total["grad_norms"]),
            grad_norm_sum=total["grad_norm_sum"],
            grad_norm_max=maximum["grad_norm_max"],
            nonfinite=per_step["nonfinite"],
            clipped=int(total["clipped"]),
        )
        summary = totals.summary(lr)
        if total["updates"]:  # clipped over every rank's updates, not over the per-step count
            summary["clipped_fraction"] = total["clipped"] / total["updates"]
        lockstep = all(total[name] == size * maximum[name] for name in _COUNTS)
        health = rank_health(
            reduced[count : count + size], reduced[count + size : count + 2 * size], self._global_rank()
        )
        return {**summary, "ranks_in_lockstep": lockstep, **health.fields()}


@dataclass(frozen=True, slots=True)
class RankFailure:
    """The exception that ended one rank's session, as its note tells it."""

    rank: int
    world_size: int
    time: datetime
    error: str  # "ValueError: bad batch"

    def end_fields(self, seen_on_rank_0: str) -> dict[str, Any]:
        """Rank 0's ``session_end`` values: the cause, then what rank 0 itself saw of it."""
        return {
            "status": "failed",
            "error": f"rank {self.rank}: {self.error}"[:2000],
            "failed_rank": self.rank,
            "rank_0_error": seen_on_rank_0,
        }


def leave_rank_failure(directory: Path, failure: RankFailure) -> None:
    """Write ``failure`` as its rank's note in ``directory``, whole or not at all (rename).

    Best effort: the rank is failing already, and its own exception is what must propagate.
    """
    path = directory / f".metrics.rank-{failure.rank}.failure"
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    note = {
        "rank": failure.rank,
        "world_size": failure.world_size,
        "time": failure.time.isoformat(),
        "error": failure.error,
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(orjson.dumps(note))
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)  # a full disk may have left part of it


def rank_failures(directory: Path, *, since: datetime, until: datetime) -> list[RankFailure]:
    """The rank failure notes in ``directory`` written in ``[since, until]``, earliest first.

    A note that is torn, unreadable or not of the note's shape is no note.
    """
    failures = []
    for path in directory.glob(RANK_FAILURE_GLOB):
        try:
            note = orjson.loads(path.read_bytes())
            failure = RankFailure(note["rank"], note["world_size"], datetime.fromisoformat(note["time"]), note["error"])
        except (OSError, orjson.JSONDecodeError, TypeError, KeyError, ValueError):
            continue
        valid = type(failure.rank) is int and type(failure.world_size) is int and isinstance(failure.error, str)
        if valid and failure.time.tzinfo is not None and since <= failure.time <= until:
            failures.append(failure)
    return sorted(failures, key=lambda failure: failure.time)


def process_start_time() -> datetime | None:
    """When this process started (Linux ``/proc``, to the clock tick), or None where unknown.

    The notes of this job's ranks are all younger: a rank can only fail once every rank of the
    process group, rank 0 included, has joined it.
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            ticks = int(stat.read().rsplit(b")", 1)[1].split()[19])  # since boot; the name may hold ")"
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    tick = 1 / os.sysconf("SC_CLK_TCK")
    started = time.time() - since_boot + (ticks - 1) * tick  # one tick early: never after the truth
    return datetime.fromtimestamp(started, timezone.utc)


class SilentWriter:
    """What ranks other than 0 hold in place of a ``MetricsWriter``: the same ``write`` API, no file.

    Every record is still built and validated exactly as rank 0's writer does (so a bad value
    fails on every rank alike), returned, and dropped.  The run directory is never created,
    opened or locked.
    """

    def __init__(self, run: RunContext) -> None:
        self._builder = MetricsWriter(run)  # never entered: no file is opened
        self.run = run
        self.path = self._builder.path
        self.discarded_bytes = 0

    def __enter__(self) -> SilentWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def close(self) -> None:
        return None

    def record(self, event: str, state: Any, values: Any) -> dict[str, Any]:
        return self._builder.record(event, state, values)

    def write(self, event: str, state: Any, /, **values: Any) -> dict[str, Any]:
        """Build and validate the record rank 0 would write; write nothing."""
        return self._builder.record(event, state, values)

    def write_config(self, state: Any, config: Mapping[str, Any], /) -> dict[str, Any]:
        """Validate the config exactly as rank 0's ``write_config`` does (size cap included); write nothing."""
        return {**self._builder.record("config", state, {}), "config": config_value(config)}
