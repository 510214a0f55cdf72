"""SIGTERM ends the dashboard's process by a deadline, whatever a thread is computing."""

from __future__ import annotations

import signal
import time

from metrics_core.dashboard.server.serving import exit_within
from tests.support import spawn_python

# A graceful handler that waits for a computation that never ends, as uvicorn waits for an answer a
# worker thread computes (and the stores' close for the lock that thread holds).
HANGING_SERVER = """
import signal, threading, time
from metrics_core.dashboard.server.serving import exit_within

stopping = threading.Event()
signal.signal(signal.SIGTERM, lambda number, frame: stopping.set())

def compute():
    total = 0
    while True:  # pure bytecode: holds the interpreter lock but for its switch interval
        total += 1

worker = threading.Thread(target=compute)
with exit_within(1.0):
    worker.start()
    print("serving", flush=True)
    while not stopping.is_set():
        time.sleep(0.01)
    worker.join()  # the graceful stop: waits for the computation
"""


def test_sigterm_ends_a_server_whose_graceful_stop_waits_on_a_computation() -> None:
    """The handler installed first still runs (the graceful stop starts), and the process ends a
    second after SIGTERM with 128 + SIGTERM, saying why, though the stop it began never ends."""
    child = spawn_python(HANGING_SERVER)
    try:
        assert child.stdout.readline() == "serving\n"
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=10) == 128 + signal.SIGTERM
        assert time.monotonic() - sent < 6
        assert "still running 1 s after SIGTERM: exiting now" in child.stderr.read()
    finally:
        child.kill()
        child.wait()


def test_the_handlers_are_put_back_when_the_server_stops_serving() -> None:
    """Outside ``exit_within`` (a lifespan that ended, in a test's process) a signal's handler is
    the one installed before it."""
    before = signal.getsignal(signal.SIGTERM)
    with exit_within(60.0) as installed:
        assert installed and signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
