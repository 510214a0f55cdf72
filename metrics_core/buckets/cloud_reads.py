"""Each cloud's own client, where it is installed, reading an object in one request
(``object_reads.OneRequestReads``): botocore on S3 (the ``s3`` extra; ETag and Last-Modified),
google-auth's authorized session on Google Cloud Storage's JSON API (the ``gcs`` extra;
generation and metageneration, ``x-goog-generation``), azure-storage-blob on Azure (the
``azure`` extra; ETag and Last-Modified).  ``reads_for`` picks, for a bucket address, its
cloud's client, else pyarrow's (``object_reads.ArrowReads``).

A root on Azure is listed through azure-storage-blob too where it is installed
(``AzureReads.listing``): List Blobs flat, 5,000 blobs a request, where pyarrow's client lists by
hierarchy, a request per directory (so per run).  S3 and Cloud Storage are listed by pyarrow, a
request per 1,000 keys.

The only code that knows the clouds' own clients; each is imported when a root of its kind is
opened.  Optional, as ``buckets``: ``import metrics_core`` never loads this module.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import quote

from pyarrow import fs as pafs

from metrics_core.buckets.addresses import (
    BucketPath,
    azure_account,
    azure_filesystem,
    error_line,
    gcs_emulator,
    gcs_filesystem,
    s3_filesystem,
)
from metrics_core.buckets.object_reads import (
    PARALLEL_GETS,
    ArrowReads,
    Listed,
    NothingThere,
    ObjectReads,
    ObjectSlice,
    OneRequestReads,
    ranged_answer,
    short_digest,
)
from metrics_core.errors import RunFileError, RunPathError

CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 10, 60  # a cloud's own client never waits longer for an answer
AZURE_LIST_PAGE = 5000  # blobs a List Blobs request answers at most
GCS_ENDPOINT = "https://storage.googleapis.com"
GCS_READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"


class BotocoreReads(OneRequestReads):
    """``OneRequestReads`` on S3 through botocore; the version is the ETag and Last-Modified."""

    def __init__(self, client: object) -> None:
        self.client = client

    def head(self, location: BucketPath) -> ObjectSlice | None:
        answer = self._call(location, "head_object")
        if answer is None:
            return None
        return ObjectSlice(answer["ContentLength"], b"", answer["ContentLength"], _version(answer))

    def _ranged(self, location: BucketPath, start: int, count: int) -> ObjectSlice | None:
        answer = self._call(location, "get_object", Range=f"bytes={start}-{start + count - 1}")
        if answer is None:
            return None
        with answer["Body"] as body:
            data = self._body(location, body)
        return ranged_answer(start, count, data, answer.get("ContentRange"), _version(answer))

    def _call(self, location: BucketPath, operation: str, **options: str) -> dict | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(Bucket=location.bucket, Key=location.key, **options)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404"):
                return None
            if code == "InvalidRange":
                raise NothingThere from exc
            raise RunFileError(location.url, f"cannot be read: {error_line(exc)}") from exc
        except BotoCoreError as exc:
            raise RunFileError(location.url, f"cannot be read: {error_line(exc)}") from exc

    @staticmethod
    def _body(location: BucketPath, body: object) -> bytes:
        from botocore.exceptions import BotoCoreError

        try:
            return body.read()
        except BotoCoreError as exc:
            raise RunFileError(location.url, f"cannot be read: {error_line(exc)}") from exc


def _version(answer: dict) -> int:
    headers = answer["ResponseMetadata"]["HTTPHeaders"]
    return short_digest(headers.get("etag", "").encode(), headers.get("last-modified", "").encode())


class GcsReads(OneRequestReads):
    """``OneRequestReads`` on Google Cloud Storage, through the JSON API with an authorized
    session of google-auth's (which gets and refreshes the credentials' tokens): a media GET with a
    ``Range`` header, whose answer states the generation and metageneration
    (``x-goog-generation``, ``x-goog-metageneration``) with the bytes; a HEAD is the object's
    metadata (its ``size``, ``generation`` and ``metageneration``).  The version is the generation
    and metageneration, so any new upload is a change.  An answer that states no generation (a
    server that omits it) holds a version no HEAD gives: ``ObjectFile`` then looks with a HEAD
    each time, two requests but no change missed."""

    def __init__(self, session: object, endpoint: str = GCS_ENDPOINT) -> None:
        self.session = session
        self.endpoint = endpoint.rstrip("/")

    def head(self, location: BucketPath) -> ObjectSlice | None:
        answer = self._call(location, params={"fields": "size,generation,metageneration"})
        if answer is None:
            return None
        metadata = answer.json()
        size = int(metadata["size"])
        return ObjectSlice(size, b"", size, _gcs_version(metadata.get("generation"), metadata.get("metageneration")))

    def _ranged(self, location: BucketPath, start: int, count: int) -> ObjectSlice | None:
        answer = self._call(location, params={"alt": "media"}, headers={"Range": f"bytes={start}-{start + count - 1}"})
        if answer is None:
            return None
        headers = answer.headers
        version = _gcs_version(headers.get("x-goog-generation"), headers.get("x-goog-metageneration"))
        return ranged_answer(start, count, answer.content, headers.get("Content-Range"), version)

    def _call(self, location: BucketPath, **options: object) -> object | None:
        """One GET of the object's JSON API address: None for 404, ``NothingThere`` for 416, else a
        ``RunFileError`` naming the object for a refusal or a failed connection."""
        import requests
        from google.auth.exceptions import GoogleAuthError

        url = f"{self.endpoint}/storage/v1/b/{quote(location.bucket, safe='')}/o/{quote(location.key, safe='')}"
        try:
            answer = self.session.get(url, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S), **options)
        except (requests.RequestException, GoogleAuthError) as exc:
            raise RunFileError(location.url, f"cannot be read: {error_line(exc)}") from exc
        if answer.status_code == 404:
            return None
        if answer.status_code == 416:
            raise NothingThere
        if answer.status_code >= 400:
            raise RunFileError(location.url, f"cannot be read: HTTP {answer.status_code} {_gcs_reason(answer)}")
        return answer


def _gcs_version(generation: object, metageneration: object) -> int:
    if generation is None:  # stated by no HEAD: never equal to what a HEAD found
        return short_digest(b"unstated")
    return short_digest(str(generation).encode(), str(metageneration).encode())


def _gcs_reason(answer: object) -> str:
    """The message of a JSON API error answer (``{"error": {"message": ...}}``), else its reason phrase."""
    try:
        message = answer.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = answer.reason
    return error_line(ValueError(message))


_Answer = TypeVar("_Answer")


class AzureReads(OneRequestReads):
    """``OneRequestReads`` on Azure Blob Storage through azure-storage-blob: Get Blob with a range,
    whose answer states the blob's size (``Content-Range``), ETag and Last-Modified with the bytes;
    a HEAD is Get Blob Properties.  The version is the ETag and Last-Modified.  Lists a root flat
    (``listing``)."""

    def __init__(self, service: object) -> None:
        self.service = service

    def head(self, location: BucketPath) -> ObjectSlice | None:
        properties = self._call(location, lambda blob: blob.get_blob_properties())
        if properties is None:
            return None
        return ObjectSlice(properties.size, b"", properties.size, _azure_version(properties))

    def _ranged(self, location: BucketPath, start: int, count: int) -> ObjectSlice | None:
        def download(blob: object) -> tuple[bytes, object]:
            answer = blob.download_blob(offset=start, length=count)  # one Get Blob up to 32 MiB, above READ_CHUNK
            return answer.readall(), answer.properties

        answered = self._call(location, download)
        if answered is None:
            return None
        data, properties = answered
        return ranged_answer(start, count, data, properties.content_range, _azure_version(properties))

    def _call(self, location: BucketPath, operation: Callable[[object], _Answer]) -> _Answer | None:
        from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError

        try:
            return operation(self.service.get_blob_client(location.bucket, location.key))
        except ResourceNotFoundError:
            return None
        except HttpResponseError as exc:
            if exc.status_code == 416:
                raise NothingThere from exc
            raise RunFileError(location.url, f"cannot be read: {_azure_reason(exc)}") from exc
        except AzureError as exc:
            raise RunFileError(location.url, f"cannot be read: {error_line(exc)}") from exc

    def listing(self, location: BucketPath) -> list[Listed]:
        """Every blob under ``location``'s prefix, flat: one List Blobs request per
        ``AZURE_LIST_PAGE`` blobs.  ``FileNotFoundError`` when the container does not exist,
        ``OSError`` saying why when the listing is refused."""
        from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError

        prefix = f"{location.key}/" if location.key else ""
        container = self.service.get_container_client(location.bucket)
        try:
            blobs = container.list_blobs(name_starts_with=prefix, results_per_page=AZURE_LIST_PAGE)
            return [
                Listed(blob.name[len(prefix) :], blob.size, int(blob.last_modified.timestamp()) * 10**9)
                for blob in blobs
            ]
        except ResourceNotFoundError as exc:
            raise FileNotFoundError(location.url) from exc
        except HttpResponseError as exc:
            raise OSError(_azure_reason(exc)) from exc
        except AzureError as exc:
            raise OSError(error_line(exc)) from exc


def _azure_version(properties: object) -> int:
    return short_digest(str(properties.etag).encode(), str(properties.last_modified).encode())


def _azure_reason(exc: Exception) -> str:
    """An Azure refusal in one line: the status, Azure's error code and the first line of its message."""
    return f"HTTP {exc.status_code} {exc.error_code or exc.reason}: {error_line(exc)}"


def s3_reads() -> ObjectReads:
    """How a runs root reads its objects: one request a read through botocore, configured from the
    same environment as ``s3_filesystem`` (``AWS_ENDPOINT_URL`` with path-style addresses, as
    ``pyarrow`` uses them; AWS's own chain for credentials and region), or ``ArrowReads`` on
    ``s3_filesystem()`` where botocore is not installed."""
    try:
        import botocore.config
        import botocore.session
    except ImportError:
        return ArrowReads(s3_filesystem())
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
    config = botocore.config.Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"max_attempts": 3, "mode": "standard"},
        max_pool_connections=2 * PARALLEL_GETS,
        s3={"addressing_style": "path"} if endpoint else None,
    )
    return BotocoreReads(botocore.session.get_session().create_client("s3", endpoint_url=endpoint, config=config))


def gcs_reads(location: BucketPath) -> ObjectReads:
    """One request a read through google-auth's authorized session with Google's default
    credentials (read-only), or anonymous at the emulator ``STORAGE_EMULATOR_HOST`` names, as
    ``gcs_filesystem``; transient failures (429, 5xx, a dropped connection) are tried 3 times.
    ``ArrowReads`` on ``gcs_filesystem()`` where google-auth is not installed; ``RunPathError``
    naming ``location`` when no credentials are found."""
    try:
        import google.auth
        from google.auth.credentials import AnonymousCredentials
        from google.auth.exceptions import DefaultCredentialsError
        from google.auth.transport.requests import AuthorizedSession
        from requests.adapters import HTTPAdapter
        from urllib3.util.retry import Retry
    except ImportError:
        return ArrowReads(gcs_filesystem())
    endpoint = gcs_emulator()
    if endpoint is None:
        try:
            credentials, _ = google.auth.default(scopes=[GCS_READ_SCOPE])
        except DefaultCredentialsError as exc:
            raise RunPathError(f"{location.url}: no Google credentials: {error_line(exc)}") from exc
    else:
        credentials = AnonymousCredentials()
    session = AuthorizedSession(credentials)
    retry = Retry(total=3, backoff_factor=0.5, status_forcelist=(429, 500, 502, 503, 504), allowed_methods=("GET",))
    session.mount(endpoint or GCS_ENDPOINT, HTTPAdapter(max_retries=retry, pool_maxsize=2 * PARALLEL_GETS))
    return GcsReads(session, endpoint or GCS_ENDPOINT)


def azure_reads(location: BucketPath) -> ObjectReads:
    """One request a read through azure-storage-blob, on the account ``addresses.azure_account`` names,
    with its key or SAS token, else Azure's default credential chain (azure-identity).
    ``ArrowReads`` on ``azure_filesystem`` where azure-storage-blob is not installed, or the
    account has neither key nor token and azure-identity is not installed."""
    account = azure_account(location)
    try:
        from azure.storage.blob import BlobServiceClient
    except ImportError:
        return ArrowReads(azure_filesystem(location))
    if account.key:
        credential: object = {"account_name": account.name, "account_key": account.key}
    elif account.sas:
        credential = account.sas
    else:
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError:
            return ArrowReads(azure_filesystem(location))
        credential = DefaultAzureCredential()
    service = BlobServiceClient(
        account.url,
        credential=credential,
        connection_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retry_total=3,
    )
    return AzureReads(service)


def reads_for(
    location: BucketPath, filesystem: pafs.FileSystem | None = None, reads: ObjectReads | None = None
) -> ObjectReads:
    """``reads`` if given, else the reads of ``filesystem`` (``ArrowReads``: a cloud's own client
    would not share its configuration), else those of the environment for ``location``'s kind of
    bucket: each cloud's own client where it is installed, else pyarrow's (a HEAD before each GET)."""
    if reads is not None:
        return reads
    if filesystem is not None:
        return ArrowReads(filesystem)
    if location.scheme == "gs":
        return gcs_reads(location)
    return azure_reads(location) if location.scheme == "az" else s3_reads()
