"""The server ends when told to, whatever it is computing: a deadline after SIGTERM or SIGINT.

uvicorn stops gracefully on SIGTERM: it waits, with no time limit, for every open connection to
finish its answer, then runs the app's shutdown (``serving.lifespan``: the stores close).  An
answer that waits for a long computation in a worker thread (a first view of a huge run), or a
shutdown that waits for a lock such a thread holds, keeps the process alive for as long as that
computation takes: to a person, a server that ignores SIGTERM; to a scheduler, one to SIGKILL
after its own grace period, its cache saves lost either way.

``exit_within``, while the server serves, puts a handler in front of the one installed (uvicorn's)
that passes the signal on and starts a daemon thread which, if the process is still alive
``seconds`` later, ends it with the exit status of a shell's killed child (128 + the signal).  A
quick shutdown stays graceful; a slow one is cut.  Python runs signal handlers in the main thread between bytecodes, which the
event loop's thread reaches even while worker threads compute: the interpreter lock is handed
over every few milliseconds.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOP_DEADLINE_S = 8.0  # after SIGTERM: within a scheduler's usual grace period (10 s and more)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def exit_within(seconds: float = STOP_DEADLINE_S, signals: Sequence[signal.Signals] = SIGNALS) -> Iterator[bool]:
    """While inside, any of ``signals`` ends the process ``seconds`` later unless it ended before;
    the handlers installed on entry still run first, and are put back on exit.  Only the main
    thread may install signal handlers: elsewhere (a server a test runs in a thread) nothing is
    installed, and the value is False."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    started = threading.Event()
    replaced = {number: signal.getsignal(number) for number in signals}
    for number, previous in replaced.items():
        if previous is not signal.SIG_IGN:
            signal.signal(number, _handler(previous, seconds, started))
    try:
        yield True
    finally:
        for number, previous in replaced.items():
            signal.signal(number, previous)


def _handler(previous: Any, seconds: float, started: threading.Event) -> Callable[[int, FrameType | None], None]:
    def received(number: int, frame: FrameType | None) -> None:
        if not started.is_set():
            started.set()
            threading.Thread(target=_end, args=(number, seconds), name="stop deadline", daemon=True).start()
        if callable(previous):
            previous(number, frame)
        else:  # the default action: nothing graceful was installed to wait for
            _end(number, 0.0)

    return received


def _end(number: int, seconds: float) -> None:
    time.sleep(seconds)
    name = signal.Signals(number).name
    os.write(sys.stderr.fileno(), f"still running {seconds:g} s after {name}: exiting now\n".encode())
    os._exit(128 + number)  # no thread is waited for, no atexit handler runs: what SIGKILL would do, sooner
