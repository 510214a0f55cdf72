"""Public path of the run reader (see ``metrics_core.read.run_reader``)."""

from metrics_core.read.run_reader import RunReader

__all__ = ["RunReader"]
