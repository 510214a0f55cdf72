"""How a session ends: the ``session_end`` status of an outcome, and SIGTERM as an exception.

One rule for ``training_session`` (a ``with`` block) and the framework integrations
(``integrations._common.RunSession``, opened and closed from callbacks), so a run reads the same
whichever wrote it:

* ``finished``: the block completed, or left by a plain ``SystemExit`` with status 0 or None
  (``sys.exit()``).  A subclass of ``SystemExit`` is someone's exit signal (Lightning raises its
  ``SIGTERMException`` as one) and is not a clean end.
* ``interrupted``: Ctrl-C (``KeyboardInterrupt``, error ``KeyboardInterrupt``) or a SIGTERM, a
  scheduler's preemption notice, turned into ``Terminated`` by ``sigterm_raises`` (error ``SIGTERM``).
* ``failed`` otherwise, with the exception's type and message (at most ``ERROR_CHARS``).

After a SIGTERM the process exits with ``SIGTERM_EXIT`` (143), the conventional status.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGTERM_EXIT = 128 + signal.SIGTERM
ERROR_CHARS = 2000  # a session_end's error: a traceback-sized message, not a log


class Terminated(BaseException):
    """Raised in the main thread by ``sigterm_raises``'s handler to unwind the training loop."""


def end_status(exc: BaseException | None) -> tuple[str, str | None]:
    """``session_end``'s ``status`` and ``error`` for a block that ended with ``exc`` (None: cleanly)."""
    if exc is None or (type(exc) is SystemExit and exc.code in (0, None)):
        return "finished", None
    if isinstance(exc, Terminated):
        return "interrupted", "SIGTERM"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", "KeyboardInterrupt"
    return "failed", f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]


@contextmanager
def sigterm_raises() -> Iterator[bool]:
    """SIGTERM raises ``Terminated`` in the main thread while the block runs, and the previous
    handler is back after it; yields whether it does (in another thread nothing changes: Python
    runs signal handlers in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return

    def terminate(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield True
    finally:
        signal.signal(signal.SIGTERM, previous)
