"""A server process's heap policy (``columns.return_large_frees_at_once``), measured in a process of
its own: it changes glibc's thresholds for the whole process."""

from __future__ import annotations

import subprocess
import sys


def test_a_server_gives_back_freed_arrays_at_once_after_its_heap_thresholds_were_raised() -> None:
    """``return_large_frees_at_once`` (the server calls it as it makes its store): in a process whose
    glibc thresholds a large freed block raised (a server's imports and first read do), run-length
    arrays freed among ones still held go back to the OS when freed, not when the heap is next
    trimmed: what made a server's peak its charts' level plus everything a snapshot had freed."""
    code = """if True:
        import numpy as np
        from metrics_core.read.columns import return_large_frees_at_once
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096
        big = np.ones(2 << 20)  # 16 MiB, mapped; freed, it raises glibc's thresholds to its size
        del big
        return_large_frees_at_once()
        before = rss()
        arrays = [np.ones(100_000) for _ in range(200)]  # a run's columns: 160 MB
        grown = rss() - before
        del arrays[::2]  # freed among ones still held: no trim of the heap's top returns them
        print(grown, rss() - before)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    grown, kept = map(int, done.stdout.split())
    assert grown > 150e6
    assert kept < 0.6 * grown, (grown, kept)  # half freed: half of it given back


def test_a_server_gives_back_what_a_parse_thread_allocated_in_arrow_once_freed() -> None:
    """A cold read parses in threads of its own into Arrow buffers, dropped by other threads:
    after ``return_large_frees_at_once`` they leave the process when freed (pyarrow's own
    allocator kept them until a later trim: what a server's first read left resident when its
    charts drew)."""
    code = """if True:
        import threading
        import numpy as np
        import pyarrow as pa
        from metrics_core.read.columns import return_large_frees_at_once
        return_large_frees_at_once()
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096
        before = rss()
        held = []
        def parse():
            held.extend(pa.allocate_buffer(800_000) for _ in range(200))  # 160 MB
            for buffer in held:
                np.frombuffer(buffer, dtype=np.uint8)[:] = 1
        thread = threading.Thread(target=parse)
        thread.start()
        thread.join()
        grown = rss() - before
        held.clear()
        print(grown, rss() - before)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    grown, kept = map(int, done.stdout.split())
    assert grown > 150e6
    assert kept < 0.2 * grown, (grown, kept)
