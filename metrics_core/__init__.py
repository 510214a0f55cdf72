"""metrics_core: crash-safe training metrics, written on GPU nodes and read by the dashboard.

Importing this package loads only the write side (``orjson`` and the standard library), so it
is safe and cheap inside a training process.  The read side lives in ``metrics_core.reader``,
``metrics_core.runs`` and ``metrics_core.watch`` and is imported explicitly by the dashboard.
"""

from metrics_core.errors import (
    MetricsError,
    RecordTypeError,
    RecordValueError,
    RunNotFoundError,
    WindowReductionError,
    WriteFailedError,
    WriterLockedError,
    WriterStateError,
)
from metrics_core.window import TrainingWindow
from metrics_core.writer import METRICS_FILENAME, SCHEMA_VERSION, MetricsWriter, RunContext, TrainingState

__all__ = [
    "METRICS_FILENAME",
    "SCHEMA_VERSION",
    "MetricsError",
    "MetricsWriter",
    "RecordTypeError",
    "RecordValueError",
    "RunContext",
    "RunNotFoundError",
    "TrainingState",
    "TrainingWindow",
    "WindowReductionError",
    "WriteFailedError",
    "WriterLockedError",
    "WriterStateError",
]
