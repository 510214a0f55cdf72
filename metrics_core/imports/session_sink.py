"""Logged scalars of one session to records, written by the write side's ``MetricsWriter``.

A source logs one name at a time (``add_scalar``: one TensorBoard event per value); a record holds
everything logged at one step.  ``SessionSink.add`` gathers consecutive values of one step into
one ``train`` and one ``validation`` record (``tag_mapping.destination`` says which), written when
the step changes or a name comes again at the same step.  Each record is stamped with the source's
own wall time (the latest of its values'), through the writer's clock, so the sessions page, the
throughput and the status read the time the work was done, not the time of the import.

A NaN or infinite value is written as ``null`` (JSON has neither; ``null`` is "no data" in the
record contract) and counted in ``nonfinite``; a ``train_loss`` that was not finite also marks its
record ``nonfinite_loss``, as the writer's own training window does, so the loss checks see it.
A record holds at most ``MAX_VALUES`` values, far below the contract's 4,096 keys: more names at
one step spill into another record at that step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metrics_core.imports.tag_mapping import TRAIN, VALIDATION, destination
from metrics_core.write.writer import MetricsWriter, RunContext, TrainingState

MAX_VALUES = 1024


class ImportClock:
    """The writer's clock during an import: the source's wall time of the record being written."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns

    def at(self, wall_time: float) -> None:
        self.now_ns = round(wall_time * 1e9)


class SessionSink:
    """One session's records, appended to ``run_dir/metrics.jsonl`` while open (module docstring)."""

    def __init__(self, run_dir: Path, *, run_id: str, session_id: str) -> None:
        self.clock = ImportClock()
        self.writer = MetricsWriter(RunContext(run_dir, run_id, session_id), clock=self.clock).__enter__()
        self.state = TrainingState()
        self.nonfinite = 0
        self.written = 0
        self._where: dict[str, tuple[str, str]] = {}
        self._values: dict[str, dict[str, Any]] = {TRAIN: {}, VALIDATION: {}}
        self._step: int | None = None
        self._wall = 0.0

    def start(self, *, step: int, wall_time: float, resumed_from_step: int | None, source: str) -> None:
        """The session's ``session_start``, at the step of its first value and its file's first time."""
        self.clock.at(wall_time)
        self.state.step = step
        self.writer.write("session_start", self.state, discarded_bytes=0, resumed_from_step=resumed_from_step,
                          imported_from=source)  # fmt: skip

    def add(self, step: int, wall_time: float, name: str, value: float) -> None:
        """One logged value (module docstring)."""
        where = self._where.get(name)
        if where is None:
            where = self._where[name] = destination(name)
        event, key = where
        values = self._values[event]
        if step != self._step or key in values or len(values) >= MAX_VALUES:
            self.flush()
            self._step = step
        if value - value:  # NaN or ±Infinity (finite: 0.0)
            self.nonfinite += 1
            value = None
            if key == "train_loss":
                values["nonfinite_loss"] = True  # as TrainingWindow marks a window whose loss was not finite
        values[key] = value
        if wall_time > self._wall:
            self._wall = wall_time

    def flush(self) -> None:
        """Write the records gathered for the current step."""
        if self._step is None:
            return
        self.clock.at(self._wall)
        self.state.step = self._step
        for event in (TRAIN, VALIDATION):
            values = self._values[event]
            if values:
                self.writer.write(event, self.state, **values)
                self.written += 1
                values.clear()
        self._step, self._wall = None, 0.0

    def end(self, wall_time: float) -> None:
        """``session_end`` status ``finished`` (how an import decides it: ``tensorboard_import``)."""
        self.flush()
        self.clock.at(max(wall_time, self.clock.now_ns / 1e9))
        self.writer.write("session_end", self.state, status="finished")

    def close(self) -> None:
        """Write what is gathered and release the run's lock."""
        try:
            self.flush()
        finally:
            self.writer.close()
