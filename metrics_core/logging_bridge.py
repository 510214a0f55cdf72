"""Public path of the logging bridge (see ``metrics_core.write.logging_bridge``)."""

from metrics_core.write.logging_bridge import capture_logger

__all__ = ["capture_logger"]
