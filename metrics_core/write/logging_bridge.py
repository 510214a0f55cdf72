"""Capture a library's metrics that go to a ``logging`` logger into ``metrics.jsonl``.

Some training libraries log their metrics as dicts on a named logger and configure no handler
(``speculators`` logs to ``speculators.metrics``): unless the application adds one, every loss
is dropped — in the field report that motivated this, an epoch's losses were lost for good.
One handler fixes that::

    with MetricsWriter(RunContext("runs/eagle3", "eagle3", new_session_id())) as writer:
        capture_logger("speculators.metrics", writer)
        trainer.train()

What becomes a record: a log record whose message is a ``dict`` (``logger.info({"loss": 0.4,
"step": 120})``); other messages are ignored.  Nested dicts are flattened with ``/``
(``{"train": {"loss": 1}}`` → ``train/loss``); ``step`` / ``global_step`` set the record's step;
0-d tensors and numpy scalars become numbers; a NaN or infinite value is written as ``null`` and
its key listed in ``nonfinite_keys`` (JSON cannot hold it, and dropping the record would lose the
rest); keys that are base fields are prefixed with ``metric_``; other values become strings.
A failure inside the handler goes to ``logging``'s own error reporting and never into the
training loop.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from metrics_core.write.writer import BASE_FIELDS, MetricsWriter, TrainingState

STEP_KEYS = ("step", "global_step")


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def _scalar(value: Any) -> Any:
    """A JSON-able value: 0-d tensors and numpy scalars unwrapped, anything else not a scalar as text."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # the library already chose to log this value; reading it is its cost
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class MetricsLogHandler(logging.Handler):
    """A ``logging.Handler`` writing dict messages as ``event`` records through ``writer``."""

    def __init__(self, writer: MetricsWriter, *, event: str = "train", state: Any = None) -> None:
        super().__init__(level=logging.DEBUG)
        self.writer = writer
        self.event = event
        self.state = state if state is not None else TrainingState()

    def emit(self, record: logging.LogRecord) -> None:
        if not isinstance(record.msg, Mapping):
            return
        try:
            values = {key: _scalar(value) for key, value in _flatten(record.msg).items()}
            for key in STEP_KEYS:
                step = values.pop(key, None)
                if isinstance(step, int) and not isinstance(step, bool):
                    self.state.step = step
            nonfinite = sorted(k for k, v in values.items() if isinstance(v, float) and not math.isfinite(v))
            for key in nonfinite:
                values[key] = None
            if nonfinite:
                values["nonfinite_keys"] = ",".join(nonfinite)
            values = {f"metric_{k}" if k in BASE_FIELDS else k: v for k, v in values.items()}
            self.writer.write(self.event, self.state, **values)
        except Exception:
            self.handleError(record)


def capture_logger(
    name: str, writer: MetricsWriter, *, event: str = "train", level: int = logging.INFO
) -> MetricsLogHandler:
    """Add a handler to logger ``name`` and make sure its level lets ``level`` records through."""
    handler = MetricsLogHandler(writer, event=event)
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    return handler
