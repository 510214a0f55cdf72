"""Public path of a bucket run's file (``metrics_core.buckets.bucket_runs``) and of the S3 client the
README's example builds (``metrics_core.buckets.addresses``)."""

from metrics_core.buckets.addresses import s3_filesystem
from metrics_core.buckets.bucket_runs import open_bucket_run

__all__ = ["open_bucket_run", "s3_filesystem"]
