"""Bucket addresses and their clients: ``s3://bucket/key``, ``gs://bucket/key`` and
``az://container/key`` split into a ``BucketPath``, and the ``pyarrow.fs`` client of each kind of
bucket configured from the environment, so that every module that lists, reads or uploads
objects reaches them the same way (``cloud_reads`` configures each cloud's own client from the
same variables: ``gcs_emulator``, ``azure_account``).

Optional: needs ``pyarrow`` (the ``s3`` extra; the head node's ``app`` extra has it already), and
``import metrics_core`` never loads this module.

Credentials come the way AWS's own tools take them (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, profiles); ``AWS_ENDPOINT_URL`` names an
S3-compatible server (MinIO, moto) and is passed on explicitly.  A ``gs://`` address is Google
Cloud Storage through ``pyarrow.fs.GcsFileSystem`` (Google's default credentials;
``STORAGE_EMULATOR_HOST`` names an emulator).  An ``az://container/prefix`` address is a container
of the storage account the Azure CLI's variables name, through ``pyarrow.fs.AzureFileSystem``
(``azure_filesystem``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

from pyarrow import fs as pafs

from metrics_core.errors import RunPathError

SCHEMES = ("s3", "gs", "az")  # S3 and S3-compatible servers; Google Cloud Storage; Azure Blob Storage
_GCS_RETRY_S = 30.0


@dataclass(frozen=True, slots=True)
class BucketPath:
    """An ``s3://bucket/key`` (``gs://bucket/key``, ``az://container/key``) address, split; ``key``
    has no leading or trailing ``/``."""

    bucket: str
    key: str
    scheme: str = "s3"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}".rstrip("/")

    @property
    def fs_path(self) -> str:
        """The path ``pyarrow.fs`` takes: ``bucket/key``."""
        return f"{self.bucket}/{self.key}".rstrip("/")

    def child(self, name: str) -> BucketPath:
        return BucketPath(self.bucket, f"{self.key}/{name}".strip("/"), self.scheme)


def parse_bucket_url(url: str) -> BucketPath:
    """``s3://bucket/prefix``, ``gs://bucket/prefix`` or ``az://container/prefix`` split into bucket
    and key, or ``RunPathError`` saying why not."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.netloc:
        raise RunPathError(
            f"{url}: not a bucket address (expected s3://bucket/prefix, gs://bucket/prefix or az://container/prefix)"
        )
    key = parts.path.strip("/")
    if ".." in key.split("/") or parts.query or parts.fragment:
        raise RunPathError(f"{url}: a bucket prefix is a plain key path, without '..', '?' or '#'")
    return BucketPath(parts.netloc, key, parts.scheme)


def s3_filesystem() -> pafs.S3FileSystem:
    """A client configured from the standard AWS variables; ``AWS_ENDPOINT_URL`` (an S3-compatible
    server) is read here because the client would otherwise go to AWS itself."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return pafs.S3FileSystem()
    parts = urlsplit(endpoint)
    return pafs.S3FileSystem(endpoint_override=parts.netloc or parts.path, scheme=parts.scheme or "https")


def gcs_emulator(environ: Mapping[str, str] = os.environ) -> str | None:
    """The emulator ``STORAGE_EMULATOR_HOST`` names (the variable Google's own clients read), as
    ``scheme://host:port``; None when it names none (Google Cloud Storage itself)."""
    emulator = environ.get("STORAGE_EMULATOR_HOST")
    if not emulator:
        return None
    parts = urlsplit(emulator if "//" in emulator else f"http://{emulator}")
    return f"{parts.scheme}://{parts.netloc}"


def gcs_filesystem() -> pafs.GcsFileSystem:
    """A Google Cloud Storage client with Google's default credentials, or the emulator
    ``gcs_emulator`` names, reached without credentials.  Transient errors are retried for at most
    ``_GCS_RETRY_S``, not the client's quarter of an hour: nothing waits forever."""
    retry = timedelta(seconds=_GCS_RETRY_S)
    emulator = gcs_emulator()
    if emulator is None:
        return pafs.GcsFileSystem(retry_time_limit=retry)
    parts = urlsplit(emulator)
    return pafs.GcsFileSystem(
        anonymous=True, endpoint_override=parts.netloc, scheme=parts.scheme, retry_time_limit=retry
    )


@dataclass(frozen=True, slots=True)
class AzureAccount:
    """A storage account as the environment names it: its name, its key or SAS token (neither: Azure's
    default credential chain), and the endpoint of its blobs, ``scheme://authority`` where an
    ``authority`` starting with ``.`` follows the account's name (``.blob.core.windows.net``) and any
    other is a path-style host that the name follows (an emulator's ``127.0.0.1:10000``)."""

    name: str
    key: str | None
    sas: str | None
    scheme: str
    authority: str

    @property
    def url(self) -> str:
        """The account's blob endpoint, as Azure's own clients take it."""
        if self.authority.startswith("."):
            return f"{self.scheme}://{self.name}{self.authority}"
        return f"{self.scheme}://{self.authority}/{self.name}"


def azure_account(location: BucketPath, environ: Mapping[str, str] = os.environ) -> AzureAccount:
    """The storage account the Azure CLI would use: ``AZURE_STORAGE_CONNECTION_STRING``
    (``AccountName``, ``AccountKey`` or ``SharedAccessSignature``, and ``BlobEndpoint`` or
    ``DefaultEndpointsProtocol``/``EndpointSuffix``: an emulator's endpoint is ``BlobEndpoint``),
    else ``AZURE_STORAGE_ACCOUNT`` with ``AZURE_STORAGE_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``, else
    that account with Azure's default credential chain (``AZURE_CLIENT_ID``…, a managed identity,
    ``az login``).  ``RunPathError`` naming ``location`` when no account is named or the
    connection string cannot be used."""
    fields = dict(
        part.split("=", 1) for part in environ.get("AZURE_STORAGE_CONNECTION_STRING", "").split(";") if "=" in part
    )
    account = fields.get("AccountName") or environ.get("AZURE_STORAGE_ACCOUNT")
    if not account:
        raise RunPathError(
            f"{location.url}: no storage account named: set AZURE_STORAGE_ACCOUNT (with AZURE_STORAGE_"
            "KEY or AZURE_STORAGE_SAS_TOKEN), or AZURE_STORAGE_CONNECTION_STRING"
        )
    if fields:
        key, sas = fields.get("AccountKey"), fields.get("SharedAccessSignature")
    else:
        key, sas = environ.get("AZURE_STORAGE_KEY"), environ.get("AZURE_STORAGE_SAS_TOKEN")
    endpoint = fields.get("BlobEndpoint")
    if not endpoint:
        suffix = fields.get("EndpointSuffix", "core.windows.net")
        return AzureAccount(
            account, key or None, sas or None, fields.get("DefaultEndpointsProtocol", "https"), ".blob." + suffix
        )
    parts = urlsplit(endpoint)
    path = parts.path.strip("/")
    if path == account:  # path-style, an emulator's: http://127.0.0.1:10000/devstoreaccount1
        authority = parts.netloc
    elif not path and parts.netloc.startswith(account + "."):  # https://account.blob.core.windows.net
        authority = parts.netloc[len(account) :]
    else:
        raise RunPathError(
            f"{location.url}: BlobEndpoint {endpoint} names neither http(s)://HOST/{account} nor https://{account}.HOST"
        )
    return AzureAccount(account, key or None, sas or None, parts.scheme or "https", authority)


def azure_filesystem(location: BucketPath, environ: Mapping[str, str] = os.environ) -> pafs.FileSystem:
    """A ``pyarrow`` client of the storage account ``azure_account`` names."""
    if getattr(pafs, "AzureFileSystem", None) is None:
        raise RunPathError(f"{location.url}: this pyarrow has no Azure Blob Storage client (pyarrow >= 16 has one)")
    account = azure_account(location, environ)
    options: dict[str, str] = {}
    if account.key:
        options["account_key"] = account.key
    elif account.sas:
        options["sas_token"] = account.sas
    # The Data Lake endpoint is asked whether the account has a hierarchical namespace: the same
    # authority as the blobs' for an emulator (Azurite answers it), the account's own otherwise.
    authority = account.authority
    dfs = authority.replace(".blob.", ".dfs.", 1) if authority.startswith(".") else authority
    return pafs.AzureFileSystem(
        account.name,
        blob_storage_authority=authority,
        blob_storage_scheme=account.scheme,
        dfs_storage_authority=dfs,
        dfs_storage_scheme=account.scheme,
        **options,
    )


def bucket_filesystem(location: BucketPath) -> pafs.FileSystem:
    """The client of ``location``'s kind of bucket, configured from the environment."""
    if location.scheme == "az":
        return azure_filesystem(location)
    return gcs_filesystem() if location.scheme == "gs" else s3_filesystem()


_NOISE = re.compile(r"<!\[CDATA\[|\]\]>| \(Request ID: [^)]*\)")  # XML quoting and request ids of S3 errors


def error_line(exc: BaseException) -> str:
    """The first line of a client error, without the server's XML quoting: the refusal stays one line."""
    text = _NOISE.sub("", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__
