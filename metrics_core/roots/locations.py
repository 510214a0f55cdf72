"""What a runs root's location names, told from the text alone: a bucket prefix (``s3://``,
``gs://``, ``az://``) or a directory.  Both root kinds and the tools that take a location import
this; it imports nothing, so telling the kind loads no bucket client."""

from __future__ import annotations

import os

BUCKET_SCHEMES = ("s3://", "gs://", "az://")
LIST_INTERVAL_S = 60.0  # a bucket root is listed at most this often (a listing costs a request per 1,000 keys)


def is_bucket_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names a bucket prefix rather than a directory."""
    return isinstance(location, str) and location.startswith(BUCKET_SCHEMES)
