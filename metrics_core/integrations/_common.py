"""What the framework integrations share: a session opened and closed from separate callbacks.

``training_session`` is a ``with`` block; a framework instead begins training in one callback and
ends it in another (or in a teardown hook that is told the outcome), and knows the step it resumed
from only once its checkpoint is loaded.  ``RunSession`` keeps the same records and statuses,
driven by those calls, and ends them by the same rule (``metrics_core.write.session_end``, whose
``sigterm_raises`` turns the scheduler's SIGTERM into an exception while a framework's ``train()``
runs, so the loop unwinds and ``session_end`` says ``interrupted``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from metrics_core.write.distributed import process_group_rank
from metrics_core.write.session_end import ERROR_CHARS, end_status
from metrics_core.write.system_sampler import SystemSampler, start_sampler, system_keys
from metrics_core.write.training_session import new_session_id
from metrics_core.write.writer import BASE_FIELDS, MetricsWriter, RunContext, TrainingState

__all__ = ["RunSession", "plain_config", "scalars"]


def plain_config(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON the writer's ``write_config`` accepts, never refusing: a config is logged for
    people to read, so an object it cannot hold (a dtype, an enum, a path, NaN) becomes its text
    rather than an exception inside someone's training run."""
    if depth > 32:
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): plain_config(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain_config(item, depth + 1) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return plain_config(value.item(), depth + 1)
    return str(value)


def scalars(values: Mapping[str, Any]) -> dict[str, Any]:
    """A framework's logged values as flat JSON scalars, never refusing: 0-d tensors read (the
    framework already chose to log them), NaN/inf as null (a diverged metric must not stop the
    training run), other objects as text, and a key that is a base field prefixed ``metric_``."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        elif value is not None and not isinstance(value, bool | int | float | str):
            value = str(value)
        out[f"metric_{key}" if key in BASE_FIELDS else str(key)] = value
    return out


class RunSession:
    """One session of a run, opened by ``start`` and closed by ``end``, each at most once.

    ``state`` holds the counters stamped on every record; the integration moves them.  A config
    that the writer refuses (over its size limit) is replaced by a record saying why: losing the
    config must not stop the training run.  With ``system_metrics`` (and the ``system`` extra) a
    sampler runs while the session is open and every ``train`` record carries its latest sample:
    this process's only (the framework's rank 0), as ``sys/<field>/rank0`` under a process group.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        run_id: str | None = None,
        session_id: str | None = None,
        fsync: bool = False,
        system_metrics: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.run_id = run_id or self.directory.resolve().name
        self.session_id = session_id
        self.fsync = fsync
        self.system_metrics = system_metrics
        self.state = TrainingState()
        self.writer: MetricsWriter | None = None
        self.sampler: SystemSampler | None = None
        self._rank: int | None = None

    @property
    def is_open(self) -> bool:
        return self.writer is not None

    def start(self, resumed_from_step: int | None, config: Mapping[str, Any] | None = None) -> None:
        """Open the writer, write ``session_start`` at ``state``'s counters, then the config."""
        context = RunContext(self.directory, self.run_id, self.session_id or new_session_id())
        writer = MetricsWriter(context, fsync=self.fsync).__enter__()
        self.writer = writer
        # The framework decides who writes (only its global rank 0 calls start); like
        # training_session, session_start names the rank and world size when a group exists.
        ranks = process_group_rank()
        distributed = {"rank": ranks[0], "world_size": ranks[1]} if ranks is not None else {}
        self._rank = ranks[0] if ranks is not None else None
        self.sampler = start_sampler() if self.system_metrics else None
        self.write(
            "session_start", discarded_bytes=writer.discarded_bytes, resumed_from_step=resumed_from_step, **distributed
        )
        if config:
            self.write_config(config)

    def write(self, event: str, /, **values: Any) -> dict[str, Any] | None:
        if self.writer is None:
            return None
        if event == "train" and self.sampler is not None:
            values = {**values, **system_keys(self.sampler.latest(), self._rank)}
        return self.writer.write(event, self.state, **values)

    def write_config(self, config: Mapping[str, Any]) -> None:
        from metrics_core.errors import MetricsError

        if self.writer is None:
            return
        try:
            self.writer.write_config(self.state, plain_config(config))
        except MetricsError as exc:
            self.writer.write("config_refused", self.state, error=f"{type(exc).__name__}: {exc}"[:ERROR_CHARS])

    def end(self, exc: BaseException | None = None) -> None:
        """Write ``session_end`` for an outcome (``exc`` None: finished) and release the file."""
        writer, self.writer = self.writer, None
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.close()
        if writer is None:
            return
        status, error = end_status(exc)
        try:
            writer.write("session_end", self.state, status=status, **({"error": error} if error else {}))
        finally:
            writer.close()
        self.session_id = None  # a later start() in this process is a new session
