"""Public path of a bucket run's file (see ``metrics_core.buckets.bucket_runs``)."""

from metrics_core.buckets.bucket_runs import open_bucket_run

__all__ = ["open_bucket_run"]
