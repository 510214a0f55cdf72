"""One training session as a context manager: ``session_start`` in, ``session_end`` out, always.

    with training_session("runs/my-run", resumed_from_step=ckpt_step, state=state) as session:
        for batch in loader:
            ...
            session.window.add(loss, tokens, grad_norm, skipped, max_grad_norm)
            if session.window.attempts == 10:
                session.log_window(lr)          # advances session.state from the window
            if time_to_validate:
                session.log_validation(val_loss, val_tokens)

Contract
--------
* ``session_start`` carries the writer's ``discarded_bytes`` (the torn tail the previous,
  crashed session left) and ``resumed_from_step``.
* ``session_end`` is always written: ``finished`` when the block completes, ``interrupted`` on
  KeyboardInterrupt or SIGTERM (what a scheduler sends before preempting), ``failed`` with the
  exception's type and message otherwise.  The exception is never swallowed: it propagates after
  the record is on disk; SIGTERM becomes ``SystemExit(143)``, the conventional exit status.
* SIGTERM is handled only while the block runs, only in the main thread, and the previous
  handler is restored afterwards.
* Session ids, when not given, are unique and sort by start time: ``20261129T172939123456Z-host-pid``.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from metrics_core.window import TrainingWindow
from metrics_core.writer import MetricsWriter, RunContext, TrainingState

SIGTERM_EXIT = 128 + signal.SIGTERM


def new_session_id(now: datetime | None = None) -> str:
    """Unique, and lexicographic order is start order: UTC time to the microsecond, host, pid."""
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    host = socket.gethostname().split(".")[0] or "host"
    return f"{when:%Y%m%dT%H%M%S%fZ}-{host}-{os.getpid()}"


class _Terminated(BaseException):
    """Raised in the main thread by our SIGTERM handler to unwind the training loop."""


class TrainingSession:
    """The open session: its writer, its counters and the current log window."""

    def __init__(self, writer: MetricsWriter, state: Any) -> None:
        self.writer = writer
        self.state = state
        self.window = TrainingWindow()

    def log(self, event: str, **values: Any) -> dict[str, Any]:
        """Write any event with the current counters."""
        return self.writer.write(event, self.state, **values)

    def log_window(self, lr: float | None, *, advance_state: bool = True, **extra: Any) -> dict[str, Any]:
        """Write the window as a ``train`` record and start a new one.

        With ``advance_state`` the counters move by the window's own totals: ``step`` by its
        successful updates, ``skipped_updates`` by its skips, ``tokens_seen`` by its tokens, so
        a trainer that passes tensors never has to read a tensor to count steps.
        """
        summary = self.window.summary(lr)
        if advance_state:
            self.state.step += summary["updates"]
            self.state.skipped_updates += summary["skipped_updates_in_window"]
            self.state.tokens_seen += summary["tokens"]
        record = self.writer.write("train", self.state, **summary, **extra)
        self.window.reset()
        return record

    def log_validation(self, val_loss: float, val_tokens: int, **extra: Any) -> dict[str, Any]:
        return self.writer.write("validation", self.state, val_loss=val_loss, val_tokens=val_tokens, **extra)

    def log_checkpoint(self, path: str | os.PathLike[str] | None = None, **extra: Any) -> dict[str, Any]:
        return self.writer.write("checkpoint", self.state, **({"path": str(path)} if path else {}), **extra)


@contextmanager
def training_session(
    directory: str | os.PathLike[str],
    *,
    run_id: str | None = None,
    session_id: str | None = None,
    state: Any = None,
    resumed_from_step: int | None = None,
    fsync: bool = False,
    handle_sigterm: bool = True,
) -> Iterator[TrainingSession]:
    """Open the run's writer, log ``session_start``, yield the session, log ``session_end``.

    ``state`` defaults to a fresh ``TrainingState``; when resuming, pass the counters restored
    from the checkpoint and ``resumed_from_step``.  ``run_id`` defaults to the directory name.
    """
    directory = Path(directory)
    context = RunContext(directory, run_id or directory.resolve().name, session_id or new_session_id())
    with MetricsWriter(context, fsync=fsync) as writer:
        session = TrainingSession(writer, state if state is not None else TrainingState())
        session.log("session_start", discarded_bytes=writer.discarded_bytes, resumed_from_step=resumed_from_step)
        previous = _install_sigterm() if handle_sigterm else None
        try:
            yield session
        except (KeyboardInterrupt, _Terminated) as exc:
            cause = "SIGTERM" if isinstance(exc, _Terminated) else "KeyboardInterrupt"
            session.log("session_end", status="interrupted", error=cause)
            if isinstance(exc, _Terminated):
                raise SystemExit(SIGTERM_EXIT) from None
            raise
        except BaseException as exc:
            if isinstance(exc, SystemExit) and exc.code in (0, None):
                session.log("session_end", status="finished")
            else:
                session.log("session_end", status="failed", error=f"{type(exc).__name__}: {exc}"[:2000])
            raise
        else:
            session.log("session_end", status="finished")
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _install_sigterm() -> Any:
    """Turn SIGTERM into an exception in the main thread; return the handler to restore."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminate(signum: int, frame: object) -> None:
        raise _Terminated

    return signal.signal(signal.SIGTERM, terminate)
