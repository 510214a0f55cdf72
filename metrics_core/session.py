"""Public path of the training session (see ``metrics_core.write.training_session``)."""

from metrics_core.write.training_session import new_session_id, training_session

__all__ = ["new_session_id", "training_session"]
