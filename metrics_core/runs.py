"""Public path of run discovery and status (``metrics_core.roots.discovery``, ``metrics_core.read.run_status``)."""

from metrics_core.read.run_status import run_status, write_failure
from metrics_core.roots.discovery import RunInfo, discover_runs, find_runs, resolve_run

__all__ = ["RunInfo", "discover_runs", "find_runs", "resolve_run", "run_status", "write_failure"]
