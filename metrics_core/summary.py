"""Public path of the run summary (see ``metrics_core.read.run_summary``)."""

from metrics_core.read.run_summary import RunSummary, summarise

__all__ = ["RunSummary", "summarise"]
