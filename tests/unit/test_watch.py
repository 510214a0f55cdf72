"""RunsWatcher: notices new runs and appends, with inotify and with polling; picks polling on NFS."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from metrics_core.roots.discovery import MAX_DEPTH, find_runs
from metrics_core.roots.watcher import RunsWatcher, filesystem_type
from tests.support import append_records, base_record


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def seen_after(watcher: RunsWatcher, sentinel: Path) -> set[Path]:
    """Append to the run ``sentinel`` and take dirty runs until it is among them: every change made
    before the append has been seen by then (inotify queues events in order; a poll that sees the
    append sees what came before it), so what the returned set lacks caused no event."""
    append_records(sentinel / "metrics.jsonl", base_record(1))
    dirty: set[Path] = set()
    assert wait_for(lambda: bool(dirty.update(watcher.take_dirty()) or sentinel in dirty))
    return dirty


@pytest.mark.parametrize("force_polling", [False, True], ids=["inotify", "polling"])
def test_watcher_sees_new_run_and_append(tmp_path: Path, force_polling: bool) -> None:
    """A run created after start bumps the structure generation; an append marks just that run dirty."""
    root = tmp_path / "runs"
    append_records(root / "old" / "metrics.jsonl", base_record(1))
    with RunsWatcher(root, force_polling=force_polling, poll_interval=0.2) as watcher:
        assert watcher.mode == ("polling" if force_polling else "inotify")
        generation = watcher.structure_generation  # start() returns once the first snapshot is taken
        append_records(root / "new" / "metrics.jsonl", base_record(1))
        assert wait_for(lambda: watcher.structure_generation > generation)
        assert wait_for(lambda: root / "new" in watcher.take_dirty())
        seen_after(watcher, root / "sentinel")  # the creation's trailing events (close_write...) too
        append_records(root / "old" / "metrics.jsonl", base_record(2))
        dirty: set[Path] = set()
        assert wait_for(lambda: bool(dirty.update(watcher.take_dirty()) or root / "old" in dirty))
        assert root / "new" not in dirty


def inotify_watches() -> int:
    """The inotify watches this process holds, as the kernel lists them (``inotify wd:`` lines)."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                lines = Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
                total += sum(line.startswith("inotify wd:") for line in lines)
        except OSError:
            continue  # closed meanwhile
    return total


def test_watches_only_what_discovery_walks(tmp_path: Path) -> None:
    """Hidden folders and folders below discovery's depth cost no inotify watch, before start or
    created after it; a run in a new walked folder is still seen."""
    root = tmp_path / "runs"
    append_records(root / "a" / "metrics.jsonl", base_record(1))
    for number in range(300):
        (root / ".git" / "objects" / f"{number:03x}").mkdir(parents=True)
    deepest = root.joinpath(*(f"d{level}" for level in range(MAX_DEPTH)))  # the deepest walked folder
    for number in range(300):
        (deepest / "below" / f"{number:03x}").mkdir(parents=True)
    append_records(deepest / "metrics.jsonl", base_record(1))
    before = inotify_watches()
    with RunsWatcher(root) as watcher:
        assert watcher.mode == "inotify"
        walked = 2 + MAX_DEPTH  # the root, a, d0 ... d5
        assert inotify_watches() - before == walked
        assert watcher.watches == walked
        (root / ".cache" / "new").mkdir(parents=True)
        (deepest / "below" / "new").mkdir()
        append_records(root / "b" / "metrics.jsonl", base_record(1))
        dirty: set[Path] = set()
        assert wait_for(lambda: bool(dirty.update(watcher.take_dirty()) or root / "b" in dirty))
        assert inotify_watches() - before == walked + 1
        assert watcher.watches == walked + 1
    assert {run.name for run in find_runs(root)} == {"a", "b", "/".join(deepest.relative_to(root).parts)}


def test_readers_own_reads_do_not_mark_dirty(tmp_path: Path) -> None:
    """Opening and reading a metrics file (as the reader does) is not a change."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, base_record(1))
    with RunsWatcher(tmp_path) as watcher:
        for _ in range(5):
            path.read_bytes()
        assert seen_after(watcher, tmp_path / "sentinel") == {tmp_path / "sentinel"}


def test_network_filesystem_means_polling(tmp_path: Path) -> None:
    """A root on NFS (per the mounts table) is watched by polling, with the reason given."""
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nhead:/export {tmp_path} nfs4 rw,vers=4.2 0 0\n")
    watcher = RunsWatcher(tmp_path / "runs", mounts_file=mounts)
    assert watcher.mode == "polling" and "nfs4" in watcher.mode_reason
    assert filesystem_type(tmp_path / "runs", mounts_file=mounts) == "nfs4"
    assert filesystem_type(Path("/"), mounts_file=mounts) == "ext4"


def test_inotify_exhaustion_falls_back_to_polling(tmp_path: Path) -> None:
    """With no inotify instance left for this user, the watcher polls instead of failing."""
    import ctypes
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    held: list[int] = []
    try:
        while len(held) < 100_000:
            fd = libc.inotify_init()
            if fd < 0:
                break
            held.append(fd)
        (tmp_path / "runs").mkdir()
        with RunsWatcher(tmp_path / "runs", poll_interval=0.2) as watcher:
            assert watcher.mode == "polling" and "inotify limit" in watcher.mode_reason
    finally:
        for fd in held:
            os.close(fd)
