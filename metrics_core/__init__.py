"""metrics_core: crash-safe training metrics, written on GPU nodes and read by the dashboard.

Importing this package loads only the write side (``orjson`` and the standard library), so it
is safe and cheap inside a training process.  The read side lives in ``metrics_core.read.run_reader``,
``metrics_core.roots.discovery`` and ``metrics_core.roots.watcher`` and is imported explicitly by the dashboard.
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
from metrics_core.write.window import TrainingWindow
from metrics_core.write.writer import METRICS_FILENAME, SCHEMA_VERSION, MetricsWriter, RunContext, TrainingState

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
