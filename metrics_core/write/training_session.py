"""One training session as a context manager: ``session_start`` in, ``session_end`` out, always.

    with training_session("runs/my-run", resumed_from_step=ckpt_step, state=state) as session:
        for batch in loader:
            ...
            session.window.add(loss, tokens, grad_norm, skipped, max_grad_norm)
            if session.window.attempts == 10:
                session.log_window(lr)          # advances session.state from the window
            if time_to_validate:
                session.log_validation(val_loss, val_tokens)

Contract
--------
* ``session_start`` carries the writer's ``discarded_bytes`` (the torn tail the previous,
  crashed session left) and ``resumed_from_step``.
* ``session_end`` is always written: ``finished`` when the block completes, ``interrupted`` on
  KeyboardInterrupt or SIGTERM (what a scheduler sends before preempting), ``failed`` with the
  exception's type and message otherwise (``metrics_core.write.session_end``, the integrations'
  rule too).  The exception is never swallowed: it propagates after the record is on disk;
  SIGTERM becomes ``SystemExit(143)``, the conventional exit status.
* SIGTERM is handled only while the block runs, only in the main thread, and the previous
  handler is restored afterwards.
* Session ids, when not given, are unique and sort by start time: ``20261129T172939123456Z-host-pid``.

Distributed (data-parallel) training
------------------------------------
When a ``torch.distributed`` process group is initialised before the block, the session sees it
by itself (nothing is imported for a single process):

* only global rank 0 opens the ``MetricsWriter``; every other rank gets a ``SilentWriter`` that
  builds and validates each record and writes nothing — it never opens or locks the metrics file,
  so ranks do not need to agree on a shared filesystem (only a failing rank's note, below, needs one);
* ``session_start`` records ``rank`` and ``world_size``;
* ``session.window`` is a ``DistributedWindow``: ``log_window`` reduces the window over the group
  (``group=``, default the world) and is therefore a **collective: call it on every rank, at the
  same points of the loop** (e.g. ``if window.attempts == 50``, which holds on every rank of a
  data-parallel job).  All ranks get the same global record and advance ``state`` identically.
  ``log``, ``log_validation`` and ``log_checkpoint`` are local and may be called on any subset of
  ranks (they write only on rank 0);
* a rank that dies or stops calling ``log_window`` makes the others fail in their next
  ``log_window`` with ``WindowReductionError`` once the process group's ``timeout`` has passed
  (gloo notices a dead peer's closed sockets at once), and rank 0 ends the session ``failed``;
* a rank whose session fails leaves its exception beside the metrics file, and rank 0 ends its
  session ``failed`` with that rank and exception (``failed_rank``; what rank 0 saw itself, the
  launcher's SIGTERM or the broken collective, in ``rank_0_error``), whatever order the ranks
  died in (``metrics_core.write.distributed``).  That is the one file a rank other than 0 writes.
* a SIGTERM that arrives while ``session_end`` is being written is absorbed: the process is
  ending with the exception already.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from metrics_core.errors import WindowReductionError, WriteFailedError
from metrics_core.write.distributed import (
    DistributedWindow,
    RankFailure,
    SilentWriter,
    leave_rank_failure,
    process_group_rank,
    process_start_time,
    rank_failures,
)
from metrics_core.write.session_end import SIGTERM_EXIT, Terminated, end_status, sigterm_raises
from metrics_core.write.system_sampler import DEFAULT_INTERVAL_S, SystemSampler, start_sampler, system_keys
from metrics_core.write.window import TrainingWindow
from metrics_core.write.writer import MetricsWriter, RunContext, TrainingState


def new_session_id(now: datetime | None = None) -> str:
    """Unique, and lexicographic order is start order: UTC time to the microsecond, host, pid."""
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    host = socket.gethostname().split(".")[0] or "host"
    return f"{when:%Y%m%dT%H%M%S%fZ}-{host}-{os.getpid()}"


class TrainingSession:
    """The open session: its writer, its counters and the current log window.

    ``rank`` and ``world_size`` are 0 and 1 without a process group; ``writes`` says whether this
    process's records reach the file (only on rank 0).
    """

    def __init__(
        self,
        writer: MetricsWriter | SilentWriter,
        state: Any,
        *,
        window: TrainingWindow | None = None,
        rank: int = 0,
        world_size: int = 1,
        sampler: SystemSampler | None = None,
        system_metrics: bool = False,
    ) -> None:
        self.writer = writer
        self.state = state
        self.window = window if window is not None else TrainingWindow()
        self.rank = rank
        self.world_size = world_size
        self.sampler = sampler
        self.system_metrics = system_metrics

    @property
    def writes(self) -> bool:
        return not isinstance(self.writer, SilentWriter)

    def log(self, event: str, **values: Any) -> dict[str, Any]:
        """Write any event with the current counters."""
        return self.writer.write(event, self.state, **values)

    def log_window(self, lr: float | None, *, advance_state: bool = True, **extra: Any) -> dict[str, Any]:
        """Write the window as a ``train`` record and start a new one.

        Under a process group this is a collective (module docstring): call it on every rank.
        With ``advance_state`` the counters move by the window's own totals: ``step`` by its
        successful updates, ``skipped_updates`` by its skips, ``tokens_seen`` by its tokens, so
        a trainer that passes tensors never has to read a tensor to count steps.
        """
        summary = self._window_summary(lr)
        if advance_state:
            self.state.step += summary["updates"]
            self.state.skipped_updates += summary["skipped_updates_in_window"]
            self.state.tokens_seen += summary["tokens"]
        record = self.writer.write("train", self.state, **summary, **extra)
        self.window.reset()
        return record

    def _window_summary(self, lr: float | None) -> dict[str, Any]:
        """The window's fields and the latest system sample's (read from memory: no I/O here)."""
        sample = self.sampler.latest() if self.sampler is not None else {}
        if isinstance(self.window, DistributedWindow):  # every rank's sample rides the window's SUM
            return self.window.summary(lr, system=sample if self.system_metrics else None)
        return {**self.window.summary(lr), **system_keys(sample)}

    def log_validation(self, val_loss: float, val_tokens: int, **extra: Any) -> dict[str, Any]:
        return self.writer.write("validation", self.state, val_loss=val_loss, val_tokens=val_tokens, **extra)

    def log_checkpoint(self, path: str | os.PathLike[str] | None = None, **extra: Any) -> dict[str, Any]:
        return self.writer.write("checkpoint", self.state, **({"path": str(path)} if path else {}), **extra)


@contextmanager
def training_session(
    directory: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    session_id: str | None = None,
    state: Any = None,
    resumed_from_step: int | None = None,
    fsync: bool = False,
    handle_sigterm: bool = True,
    group: Any = None,
    config: Mapping[str, Any] | None = None,
    system_metrics: bool = True,
    system_interval: float = DEFAULT_INTERVAL_S,
) -> Iterator[TrainingSession]:
    """Open the run's writer, log ``session_start``, yield the session, log ``session_end``.

    ``state`` defaults to a fresh ``TrainingState``; when resuming, pass the counters restored
    from the checkpoint and ``resumed_from_step``.  ``run_id`` defaults to the directory name.
    ``group`` is the process group windows are reduced over when ``torch.distributed`` is
    initialised (default: the world; pass the data-parallel group under tensor/pipeline parallelism).
    ``config`` (hyperparameters) is logged once as a ``config`` record right after ``session_start``;
    every rank validates it, only rank 0 writes it, and a refused config ends the session ``failed``.
    ``system_metrics`` samples host, process and GPU every ``system_interval`` seconds on a thread
    (``metrics_core.write.system_sampler``; needs the ``system`` extra, silently off without it) and adds the
    latest sample to each ``train`` record; under a process group pass the same value on every rank.
    """
    directory = Path(directory)
    context = RunContext(directory, run_id or directory.resolve().name, session_id or new_session_id())
    ranks = process_group_rank()
    rank, world_size = ranks if ranks is not None else (0, 1)
    writer = MetricsWriter(context, fsync=fsync) if rank == 0 else SilentWriter(context)
    with writer, _sampling(system_metrics, system_interval) as sampler:
        session = TrainingSession(
            writer,
            state if state is not None else TrainingState(),
            window=DistributedWindow(group=group) if ranks is not None else None,
            rank=rank,
            world_size=world_size,
            sampler=sampler,
            system_metrics=system_metrics,
        )
        distributed = {"rank": rank, "world_size": world_size} if ranks is not None else {}
        session.log(
            "session_start", discarded_bytes=writer.discarded_bytes, resumed_from_step=resumed_from_step, **distributed
        )
        with sigterm_raises() if handle_sigterm else nullcontext(False) as sigterm_raising:
            job_started = (process_start_time() or datetime.now(timezone.utc)) if ranks is not None else None
            try:
                if config is not None:
                    session.writer.write_config(session.state, config)
                yield session
            except BaseException as exc:
                if sigterm_raising:  # a SIGTERM now must not cut the session_end being written
                    signal.signal(signal.SIGTERM, _absorb_sigterm)
                status, error = end_status(exc)
                end = {"status": status, **({"error": error} if error is not None else {})}
                if job_started is not None and status != "finished":
                    end = _rank_cause(session, exc, end, job_started)
                _end_while_unwinding(session, exc, **end)
                if isinstance(exc, Terminated):
                    raise SystemExit(SIGTERM_EXIT) from None
                raise
            else:
                session.log("session_end", status="finished")


def _rank_cause(
    session: TrainingSession, exc: BaseException, end: dict[str, Any], job_started: datetime
) -> dict[str, Any]:
    """The ``session_end`` of a data-parallel session, with the failing rank named (module docstring).

    A rank other than 0 leaves its own failure for rank 0 to find, unless it is the symptom of
    another rank's (a broken window reduction).  Rank 0 ends with the earliest rank failure since
    its job started, when there is one, ahead of what it saw itself (SIGTERM, a broken collective);
    a failure every rank shares (a record refused after the reduction raises the same error on
    each) stays rank 0's own.
    """
    now = datetime.now(timezone.utc)
    directory = session.writer.run.directory
    if not session.writes:
        if end["status"] == "failed" and not isinstance(exc, WindowReductionError):
            leave_rank_failure(directory, RankFailure(session.rank, session.world_size, now, end["error"]))
        return end
    failures = [
        failure for failure in rank_failures(directory, since=job_started, until=now) if failure.error != end["error"]
    ]
    return failures[0].end_fields(end["error"]) if failures else end


@contextmanager
def _sampling(enabled: bool, interval: float) -> Iterator[SystemSampler | None]:
    """A system sampler running while the block does (None when off or without the extra)."""
    sampler = start_sampler(interval=interval) if enabled else None
    try:
        yield sampler
    finally:
        if sampler is not None:
            sampler.close()


def _end_while_unwinding(session: TrainingSession, exc: BaseException, **values: Any) -> None:
    """Write ``session_end`` while ``exc`` propagates; a full disk must not replace ``exc``.

    The writer has already left its failure note (the run reads ``failed``), so the training
    error, which is what the user needs to see, goes on with the write error as a note on it.
    """
    try:
        session.log("session_end", **values)
    except WriteFailedError as failure:
        exc.add_note(f"session_end was not written: {failure}")


def _absorb_sigterm(signum: int, frame: object) -> None:
    """While the session unwinds the process is ending already; the signal adds nothing."""
