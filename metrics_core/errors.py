"""The one exception hierarchy of metrics_core.

Every error the library raises on purpose derives from ``MetricsError``, so training code can
catch "anything the metrics layer refused" in one clause.  Subclasses are grouped by cause and
also derive from the matching built-in (``ValueError``, ``TypeError`` ...), so code written
against the built-ins keeps working.  Messages say what was expected, what arrived, and where
(path, line number, key) when there is a where; ``os_cause`` words what the OS refused.
"""

from __future__ import annotations

import errno
import os


class MetricsError(Exception):
    """Base class of every error raised on purpose by metrics_core."""


class RecordValueError(MetricsError, ValueError):
    """A record field has a value the format cannot hold (NaN, Infinity, a reserved key)."""


class RecordTypeError(MetricsError, TypeError):
    """A record field has a type that is not a JSON scalar."""


class WriterLockedError(MetricsError, RuntimeError):
    """Another writer already holds the run's metrics file."""


class WriterStateError(MetricsError, RuntimeError):
    """The writer was used outside its ``with`` block (not opened yet, or already closed)."""


class WriterForkedError(MetricsError, RuntimeError):
    """A forked child wrote through a writer its parent opened (both would write at one offset)."""


class WriteFailedError(MetricsError, OSError):
    """The OS refused to write a metrics file: disk full, file-size limit, I/O error.

    Also an ``OSError`` with the original ``errno`` and the file as ``filename``, so code that
    catches ``OSError`` or checks ``exc.errno == errno.ENOSPC`` keeps working; ``str()`` is the
    whole message: the file, the cause, and what state the file was left in.
    """

    def __str__(self) -> str:
        return str(self.strerror)


class RunNotFoundError(MetricsError, FileNotFoundError):
    """A run directory or metrics file that was asked for does not exist."""


class RunFileError(MetricsError, OSError):
    """A run's file is there but cannot be read as one: not a regular file (a FIFO, a directory, a
    device), or the OS refused to open it (permissions).

    Also an ``OSError`` with the original ``errno`` (when the OS gave one) and the file as
    ``filename``; ``reason`` is the message without the path, for a caller that names the file
    its own way (relative to a runs root); ``str()`` is the whole message.
    """

    def __init__(self, path: str, reason: str, errno: int | None = None) -> None:
        super().__init__(errno, f"{path}: {reason}", path)
        self.reason = reason

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[type, tuple[str, str, int | None]]:
        return type(self), (self.filename, self.reason, self.errno)  # pickled across processes


class RunPathError(MetricsError, ValueError):
    """A run name that points outside the runs root (``..``, an absolute path, a symlink escape)."""


class WindowReductionError(MetricsError, RuntimeError):
    """The collective that reduces a window across ranks failed: a rank died, hung or skipped it."""


class AlertConfigError(MetricsError, ValueError):
    """An alerts configuration (TOML file or option) that cannot be used: the file, the key and why."""


def os_cause(exc: OSError) -> str:
    """``"No space left on device (ENOSPC)"``: the OS's words and the name to search for."""
    name = errno.errorcode.get(exc.errno or 0, f"errno {exc.errno}")
    return f"{exc.strerror or os.strerror(exc.errno or 0)} ({name})"
