"""``python -m metrics_core sync RUN_DIR s3://bucket/prefix/RUN``: a run's file into a bucket as it grows.

Uploads the file as the immutable parts ``bucket_files.PartsFile`` reads
(``RUN/metrics.jsonl.parts/<offset>.jsonl``, the layout is documented there), so a live run costs
one upload of each byte, where uploading the whole file again at every refresh costs its size
each time: quadratic in its length.  Needs ``pyarrow`` (the ``s3`` extra); ``import metrics_core``
never loads this module.

Contract:

* **Complete lines only.**  A pass uploads the bytes from the uploaded offset to the file's last
  newline as one part (a larger backlog as parts of at most ``MAX_PART_BYTES``, cut at line ends);
  an incomplete last line (a writer mid-line, or killed there) stays local until its newline
  arrives or a resumed writer cuts it.  Its end is looked for ``SCAN_BYTES`` at a time, so a
  pass over a tail with no newline holds at most a part and a scan in memory, however long the
  tail; a line longer than a part is read whole only once it is complete (it is one part).
* **Never twice, never changed.**  A part is written once under a name no other part takes; S3
  makes an upload visible only when it completes, so a sync killed mid-upload leaves no part and
  the next one uploads the same bytes under the same name.
* **Resuming** lists the parts (the uploaded offset is where the last one ends) and compares the
  local file with what they hold before uploading anything: the first ``HEAD_BYTES`` (the run's
  first record) and the last part (its last ``TAIL_BYTES`` when larger), byte for byte (a digest
  cannot ride along: pyarrow's client stores no user metadata on an object).  Each pass compares
  the same bytes, and those it uploaded since, again.  A local file that shrank below the
  uploaded offset or was rewritten is refused in one line and nothing is deleted: readers may be
  reading the parts, and which copy is right is the user's call (another prefix, or delete the
  parts to upload it anew).
* **Following** (``--follow``): a pass every ``--interval`` seconds, at most one part each (plus
  one per ``MAX_PART_BYTES`` of backlog), so parts per day are bounded by the interval whatever the
  write rate.  It ends, exit status 0, when the writer's session is over and everything is
  uploaded (the last record is a ``session_end``, no writer holds the file's lock, no incomplete
  line is left), or on Ctrl-C / SIGTERM after one more pass uploads what is complete.  A run whose
  writer was killed is followed until a signal: a resumed session may still append to it.
* Any error (no such bucket, wrong credentials, a part missing, a refused file) ends it with one
  line on stderr and status 2; running it again resumes from the parts.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pyarrow import fs as pafs

from metrics_core.buckets.addresses import BucketPath
from metrics_core.buckets.bucket_files import PARTS_DIRNAME, PartsFile, upload_part
from metrics_core.errors import RunFileError, RunNotFoundError
from metrics_core.read.records import check_record
from metrics_core.read.run_file import LocalFile, metrics_path, named_directory, run_file_path

INTERVAL_S = 60.0  # at most 1,440 parts a day; a line is in the bucket within a minute of its newline
MAX_PART_BYTES = 64 << 20  # memory per part: a part is read whole before its upload starts
SCAN_BYTES = 1 << 20  # read at a time looking for the end of a line longer than a part
HEAD_BYTES = 4 << 10  # the first record: run id, session id, time
TAIL_BYTES = 1 << 20  # compared at the end of what is uploaded: a resumed sync reads this much of the last part
_STOP_CHECK_S = 0.1  # how soon a sleeping --follow notices Ctrl-C or SIGTERM
_START_OVER = "sync it to another prefix, or delete the parts to upload it anew"


@dataclass(frozen=True, slots=True)
class Pass:
    """What one pass did: the parts it uploaded (address, bytes), and whether the run is over."""

    uploaded: list[tuple[BucketPath, int]]
    ended: bool


class RunSync:
    """Uploads one run's complete lines to ``run`` (``s3://bucket/prefix/RUN``) as parts; see the
    module docstring."""

    def __init__(self, run: BucketPath, filesystem: pafs.FileSystem) -> None:
        self.run = run
        self.parts = run.child(PARTS_DIRNAME)
        self.filesystem = filesystem
        self.uploaded = 0  # bytes of the file the parts hold
        self._head = b""  # the first bytes uploaded
        self._tail = b""  # the last bytes uploaded

    def resume(self) -> None:
        """Continue after the parts already in the bucket: one listing and the reads of the first
        bytes and of the last part.  ``RunFileError`` when they cannot be listed or read, or end
        mid-line (not sync's parts)."""
        remote = PartsFile(self.run, self.filesystem)
        if remote.stat() is None:
            return
        remote.open()
        end = remote.size()
        last = remote.parts[-1]
        self._head = remote.read(0, HEAD_BYTES)
        self._tail = remote.read(max(last.start, end - TAIL_BYTES), TAIL_BYTES)
        remote.close()
        if remote.size() != end or not self._tail.endswith(b"\n"):
            raise RunFileError(
                self.parts.url,
                f"a part ends mid-line at byte {remote.size():,}: sync uploads whole "
                "lines only; delete that part to continue",
            )
        self.uploaded = end

    def step(
        self, path: Path, progress: Callable[[int, int], None] | None = None, *, within: Path | None = None
    ) -> Pass:
        """One pass over the local file ``path``: check it still holds what is uploaded, then upload
        the lines completed since the last pass; ``progress(bytes uploaded, file size)`` before
        the first part and after each.  ``within``: the directory the file must lie inside
        (``LocalFile``): nothing outside the run named is uploaded, whatever link it becomes."""
        local = LocalFile(path, within=within)
        local.open()
        try:
            size = local.size()
            self._check(local, size)
            uploaded = []
            if progress is not None:
                progress(self.uploaded, size)
            while data := self._complete_lines(local, size):
                uploaded.append((upload_part(self.filesystem, self.parts, self.uploaded, data), len(data)))
                if not self.uploaded:
                    self._head = data[:HEAD_BYTES]
                self._tail = (self._tail + data[-TAIL_BYTES:])[-TAIL_BYTES:]
                self.uploaded += len(data)
                if progress is not None:
                    progress(self.uploaded, size)
            ended = size == self.uploaded and local.writer_alive() is False and self._session_ended()
            return Pass(uploaded, ended)
        finally:
            local.close()

    def _check(self, local: LocalFile, size: int) -> None:
        """``RunFileError`` when the local file no longer holds the bytes already uploaded."""
        if size < self.uploaded:
            raise RunFileError(
                str(local.path),
                f"shrank to {size:,} bytes, below the {self.uploaded:,} bytes "
                f"already uploaded to {self.parts.url}; {_START_OVER}",
            )
        tail_at = self.uploaded - len(self._tail)
        if local.read(0, len(self._head)) != self._head or local.read(tail_at, len(self._tail)) != self._tail:
            raise RunFileError(
                str(local.path),
                f"was rewritten: its first {self.uploaded:,} bytes are not those "
                f"already uploaded to {self.parts.url}; {_START_OVER}",
            )

    def _complete_lines(self, local: LocalFile, size: int) -> bytes:
        """The next part: the complete lines from the uploaded offset, up to ``size`` and at most
        ``MAX_PART_BYTES`` (a single longer line whole); empty when no line is complete."""
        start = self.uploaded
        data = local.read(start, min(MAX_PART_BYTES, size - start))
        cut = data.rfind(b"\n") + 1
        if not cut and start + len(data) < size:  # one line longer than a part, complete or not
            end = _line_end(local, start + len(data), size)
            if end is None:
                return b""
            data, cut = data + local.read(start + len(data), end - start - len(data)), end - start
        return data[:cut]

    def _session_ended(self) -> bool:
        """Whether the last uploaded line is a ``session_end`` record."""
        last = self._tail[self._tail.rfind(b"\n", 0, len(self._tail) - 1) + 1 : -1]
        record = check_record(last)
        return isinstance(record, dict) and record["event"] == "session_end"


def _line_end(local: LocalFile, offset: int, size: int) -> int | None:
    """Where the line going on at ``offset`` ends (just past its newline), or None when it does not
    end before ``size``: read ``SCAN_BYTES`` at a time, never the rest of the file at once."""
    while offset < size:
        chunk = local.read(offset, min(SCAN_BYTES, size - offset))
        if not chunk:
            return None
        newline = chunk.find(b"\n")
        if newline >= 0:
            return offset + newline + 1
        offset += len(chunk)
    return None


class _Stop:
    """Set by Ctrl-C and SIGTERM: a flag, where an exception could cut an upload, and where an
    ``Event.set()`` in a signal handler could wait for a lock the interrupted code holds."""

    def __init__(self) -> None:
        self.requested = False

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or less once a stop is requested (noticed within ``_STOP_CHECK_S``)."""
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, _STOP_CHECK_S))


@contextmanager
def _stop_on_signals() -> Iterator[_Stop]:
    """Ctrl-C and SIGTERM request a stop instead of ending the process mid-pass."""
    stop = _Stop()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = [signal.signal(number, lambda *_: setattr(stop, "requested", True)) for number in signals]
    try:
        yield stop
    finally:
        for number, handler in zip(signals, previous, strict=True):
            signal.signal(number, handler)


def upload(
    sync: RunSync,
    run_dir: str | Path,
    *,
    follow: bool = False,
    interval: float = INTERVAL_S,
    on_pass: Callable[[Pass], None],
    on_wait: Callable[[Path], None],
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """One pass of ``sync`` over the run in ``run_dir``; with ``follow``, a pass every ``interval``
    seconds until the run is over or Ctrl-C / SIGTERM (module docstring), calling ``on_pass``
    after each pass and ``on_wait`` (with the file's path) once if the file is not there yet;
    ``progress`` as ``RunSync.step`` takes it.
    ``MetricsError`` on the first error: nothing more is uploaded."""
    within = named_directory(run_dir)
    with _stop_on_signals() as stop:
        if not follow:
            on_pass(sync.step(metrics_path(run_dir), progress, within=within))
            return
        waiting = False
        while True:
            stopping = stop.requested  # a signal during this pass: one more pass, then out
            try:
                path = metrics_path(run_dir)
            except RunNotFoundError:
                if not waiting:
                    on_wait(run_file_path(run_dir))
                waiting, done = True, None
            else:
                done = sync.step(path, progress, within=within)
                on_pass(done)
            if stopping or (done is not None and done.ended):
                return
            stop.wait(interval)
