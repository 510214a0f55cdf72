"""The columnar cache: a reopen restores exactly what a cold parse gives, and never serves stale data."""

from __future__ import annotations

import os
import shutil
import stat
import tracemalloc
from pathlib import Path

import pytest

import metrics_core.read.run_reader as reader_module
from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.records import check_lines
from metrics_core.read.run_reader import RunReader
from tests.support import HOSTILE, append_bytes, base_record, line, snapshot


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def records(first: int, count: int, session: str = "s1") -> bytes:
    return b"".join(
        line(base_record(step, session=session, train_loss=3.0 - step / 1e4, note=f"n{step % 3}"))
        for step in range(first, first + count)
    )


def run_file(tmp_path: Path) -> Path:
    path = tmp_path / "runs" / "r1" / "metrics.jsonl"
    data = (
        records(1, 300)
        + line(base_record(300, event="validation", val_loss=2.0))
        + HOSTILE["NaN literal"]
        + line(base_record(250, event="session_start", session="s2", resumed_from_step=250, discarded_bytes=7))
        + records(251, 200, session="s2")
        + line(base_record(451, session="s2", flag=True, mixed=1, empty=None))
        + line(base_record(452, session="s2", flag=None, mixed="x", big=1 << 63))
        + line(base_record(450, event="session_end", session="s2", status="ok"))
    )
    append_bytes(path, data)
    return path


@pytest.fixture
def policy(tmp_path: Path) -> CachePolicy:
    return CachePolicy(tmp_path / "cache", min_records=100, interval_s=60.0, clock=Clock())


@pytest.fixture
def cache_loads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each reader with a cache was restored from it when it opened the file, in order:
    a reopen's snapshot equals a cold parse whether or not the cache served, so tests check this too."""
    answers: list[bool] = []
    opened: set[int] = set()
    refresh = RunReader.refresh

    def recording(reader: RunReader) -> int:
        count = refresh(reader)
        if reader.cache is not None and id(reader) not in opened:  # its first refresh opened the file
            opened.add(id(reader))
            answers.append(reader.served_from_cache)
        return count

    monkeypatch.setattr(RunReader, "refresh", recording)
    return answers


def cold(path: Path) -> dict:
    reader = RunReader(path)
    reader.refresh()
    return snapshot(reader)


@pytest.mark.parametrize("threshold", [1 << 40, 0], ids=["per line", "bulk"])
def test_a_cold_parse_of_enough_records_is_saved_and_a_reopen_restores_it_exactly(
    tmp_path: Path, policy: CachePolicy, cache_loads: list[bool], threshold: int
) -> None:
    """The second reader parses nothing from the file and still equals a cold parse (every column kind)."""
    path = run_file(tmp_path)
    first = RunReader(path, cache=policy, bulk_threshold=threshold)
    first.refresh()
    assert len(list(policy.directory.glob("*.mcc"))) == 1
    second = RunReader(path, cache=policy)
    second.refresh()
    kinds = {name: second.column("train", name).kind for name in ("flag", "mixed", "note", "big")}
    assert {kinds["flag"], kinds["mixed"], kinds["note"], kinds["big"]} == {"bool", "object", "cat", "float"}
    assert cache_loads == [False, True]
    assert snapshot(second) == snapshot(first) == cold(path)


def test_records_appended_after_the_save_are_parsed_from_the_cached_offset(
    tmp_path: Path, policy: CachePolicy, cache_loads: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cache + tail equals a cold parse of the grown file, and only the tail is parsed."""
    path = run_file(tmp_path)
    RunReader(path, cache=policy).refresh()
    append_bytes(path, records(451, 20, session="s2") + HOSTILE["repeated event"] + b'{"torn')
    reader = RunReader(path, cache=policy)
    parsed = []

    def counting_check_lines(block: bytes, first_line: int, **kwargs: object) -> object:
        parsed.append((first_line, block.count(b"\n")))
        return check_lines(block, first_line, **kwargs)

    monkeypatch.setattr(reader_module, "check_lines", counting_check_lines)
    assert reader.refresh() == 20
    assert parsed == [(507, 21)]  # from line 507 on: the 20 appended records and the bad line
    assert cache_loads == [False, True]
    assert snapshot(reader) == cold(path)


def test_appends_after_a_reopen_leave_held_frames_as_they_were(
    tmp_path: Path, policy: CachePolicy, cache_loads: list[bool]
) -> None:
    """Restored columns share the cache file's buffer: appends (new categories, a new session, every
    event) grow them into buffers of their own, never write into it or change a frame already held."""
    path = run_file(tmp_path)
    RunReader(path, cache=policy).refresh()
    reader = RunReader(path, cache=policy)
    reader.refresh()
    assert cache_loads == [False, True]  # the columns are the cache file's
    held = {event: reader.frame(event).copy(deep=True) for event in reader.events}
    frames = {event: reader.frame(event) for event in reader.events}
    append_bytes(
        path,
        line(base_record(453, session="s2", note="new note", flag=False, mixed=2.5))
        + line(base_record(460, event="validation", session="s3", val_loss=1.5))
        + line(base_record(460, event="session_start", session="s3"))
        + records(461, 3, session="s3"),
    )
    assert reader.refresh() == 6
    for event, frame in frames.items():
        assert frame.equals(held[event]), event
    assert snapshot(reader) == cold(path)


def test_a_reopen_holds_the_cached_columns_once(tmp_path: Path, cache_loads: list[bool]) -> None:
    """Reading the cache file allocates about its size, not the file and a copy of its columns."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_bytes(path, records(1, 20_000))
    policy = CachePolicy(tmp_path / "cache", min_records=1)
    RunReader(path, cache=policy).refresh()
    (cached,) = policy.directory.glob("*.mcc")
    reader = RunReader(path, cache=policy)
    tracemalloc.start()
    try:
        reader.refresh()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cache_loads == [False, True] and reader.records == 20_000
    assert peak < 1.3 * cached.stat().st_size  # a read and then a copy of the columns: 2x


def test_a_save_streams_the_columns_to_its_file_without_a_copy_of_them(tmp_path: Path, cache_loads: list[bool]) -> None:
    """A save writes the columns as they are: what it allocates (Python's heap and Arrow's pool) is
    a small part of the file it writes, not the file and the copies it was made from."""
    import pyarrow as pa

    path = tmp_path / "r" / "metrics.jsonl"
    append_bytes(path, records(1, 20_000))
    policy = CachePolicy(tmp_path / "cache", min_records=1, save_inline=False)
    reader = RunReader(path, cache=policy)
    reader.refresh()
    pending = reader.capture_cache()
    assert pending is not None
    default = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(default)
    pa.set_memory_pool(pool)
    tracemalloc.start()
    try:
        assert pending.write()
        peak = tracemalloc.get_traced_memory()[1] + pool.max_memory()
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(default)
    (cached,) = policy.directory.glob("*.mcc")
    assert peak < 0.25 * cached.stat().st_size
    reopened = RunReader(path, cache=policy)
    reopened.refresh()
    assert cache_loads == [False, True]
    assert snapshot(reopened) == snapshot(reader)


@pytest.mark.parametrize("rewrite", ["truncate and rewrite", "cp over", "replace", "shrink"])
def test_a_rewritten_file_never_gets_the_cache_of_its_old_content(
    tmp_path: Path, policy: CachePolicy, cache_loads: list[bool], rewrite: str
) -> None:
    """Same path (and same inode for the in-place rewrites), other content: the cache is ignored."""
    path = run_file(tmp_path)
    RunReader(path, cache=policy).refresh()
    new = records(1, 400, session="other")  # longer than the cached offset
    if rewrite == "truncate and rewrite":
        path.write_bytes(new)
    elif rewrite == "cp over":
        path.with_name("src").write_bytes(new)
        shutil.copyfile(path.with_name("src"), path)
    elif rewrite == "replace":
        path.with_name("src").write_bytes(new)
        os.replace(path.with_name("src"), path)
    else:
        path.write_bytes(path.read_bytes()[:1000])
    reader = RunReader(path, cache=policy)
    reader.refresh()
    assert cache_loads == [False, False]
    assert snapshot(reader) == cold(path)


def test_a_same_size_rewrite_that_keeps_the_first_line_is_caught_by_the_last_line(
    tmp_path: Path, policy: CachePolicy, cache_loads: list[bool]
) -> None:
    """Same inode, size and first line; other records after it: the cached last line no longer matches."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_bytes(path, records(1, 200))
    RunReader(path, cache=policy).refresh()
    data = path.read_bytes()
    first_end = data.index(b"\n") + 1
    path.write_bytes(data[:first_end] + records(2, 199).replace(b'"s1"', b'"s9"'))
    assert len(path.read_bytes()) == len(data)
    reader = RunReader(path, cache=policy)
    reader.refresh()
    assert cache_loads == [False, False]
    assert snapshot(reader) == cold(path)


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "garbage", "empty", "directory"])
def test_a_corrupt_cache_file_is_ignored_without_an_exception(
    tmp_path: Path, policy: CachePolicy, cache_loads: list[bool], damage: str
) -> None:
    """Whatever the cache file holds, the reader parses the run and gives the cold answer."""
    path = run_file(tmp_path)
    RunReader(path, cache=policy).refresh()
    (cached,) = policy.directory.glob("*.mcc")
    data = cached.read_bytes()
    if damage == "truncated":
        cached.write_bytes(data[: len(data) // 2])
    elif damage == "flipped byte":
        cached.write_bytes(data[:-100] + bytes([data[-100] ^ 1]) + data[-99:])
    elif damage == "garbage":
        cached.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        cached.write_bytes(b"")
    else:
        cached.unlink()
        cached.mkdir()
    reader = RunReader(path, cache=policy)
    reader.refresh()
    assert cache_loads == [False, False]
    assert snapshot(reader) == cold(path)


def test_a_read_only_runs_root_is_never_written(tmp_path: Path, policy: CachePolicy, cache_loads: list[bool]) -> None:
    """The cache goes to its own directory; the run directory stays untouched (and may be read-only)."""
    path = run_file(tmp_path)
    run_dir = path.parent
    os.chmod(run_dir, stat.S_IRUSR | stat.S_IXUSR)
    try:
        before = sorted(p.name for p in run_dir.iterdir())
        RunReader(path, cache=policy).refresh()
        reader = RunReader(path, cache=policy)
        reader.refresh()
        assert sorted(p.name for p in run_dir.iterdir()) == before
        assert cache_loads == [False, True]
        assert snapshot(reader) == cold(path)
    finally:
        os.chmod(run_dir, stat.S_IRWXU)


def test_an_unwritable_cache_directory_means_no_cache_and_no_error(tmp_path: Path) -> None:
    """A cache directory that cannot be created or written costs nothing but the cache."""
    path = run_file(tmp_path)
    blocked = tmp_path / "blocked"
    blocked.write_bytes(b"a file where the directory should be")
    policy = CachePolicy(blocked / "cache", min_records=1)
    reader = RunReader(path, cache=policy)
    reader.refresh()
    reader.close()
    assert snapshot(reader) == cold(path)
    assert not reader.save_cache()  # (the file is closed, and the directory cannot exist)


def test_a_live_run_is_saved_at_most_once_per_interval_and_on_close(
    tmp_path: Path, policy: CachePolicy, cache_loads: list[bool]
) -> None:
    """After the cold save, appends are saved once the interval passed, and close() saves the rest."""
    path = run_file(tmp_path)
    reader = RunReader(path, cache=policy)
    reader.refresh()
    (cached,) = policy.directory.glob("*.mcc")
    saved = cached.stat().st_mtime_ns, cached.read_bytes()
    append_bytes(path, records(451, 5, session="s2"))
    reader.refresh()
    assert cached.read_bytes() == saved[1]  # within the interval: not saved
    policy.clock.now += 61
    append_bytes(path, records(456, 5, session="s2"))
    reader.refresh()
    assert cached.read_bytes() != saved[1]
    append_bytes(path, records(461, 5, session="s2"))
    reader.refresh()
    interval_save = cached.read_bytes()
    reader.close()
    assert cached.read_bytes() != interval_save  # close() saved the last appends
    fresh = RunReader(path, cache=policy)
    fresh.refresh()
    assert cache_loads == [False, True]
    assert snapshot(fresh) == cold(path)


def test_a_small_run_is_not_cached(tmp_path: Path, policy: CachePolicy) -> None:
    """Below min_records a cold parse is cheap: no file is written, even on close."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_bytes(path, records(1, 10))
    reader = RunReader(path, cache=policy)
    reader.refresh()
    reader.close()
    assert not policy.directory.exists() or not list(policy.directory.glob("*.mcc"))


def test_two_readers_saving_one_run_leave_one_valid_file(
    tmp_path: Path, policy: CachePolicy, cache_loads: list[bool]
) -> None:
    """Saves are atomic replacements: whichever wins, the file restores the cold answer; no temp files stay."""
    path = run_file(tmp_path)
    a, b = RunReader(path, cache=policy), RunReader(path, cache=policy)
    a.refresh()
    b.refresh()
    append_bytes(path, records(451, 3, session="s2"))
    a.refresh()
    assert a.save_cache() and b.save_cache()  # b is behind: its cache is valid for its offset
    assert [p.name for p in policy.directory.iterdir() if not p.name.endswith(".mcc")] == []
    reader = RunReader(path, cache=policy)
    reader.refresh()
    assert cache_loads[-1] is True  # whichever save won
    assert snapshot(reader) == cold(path)


def test_the_cache_directory_is_bounded(tmp_path: Path) -> None:
    """Beyond max_total_bytes the least recently written cache files are removed; too big a run is not cached."""
    paths = []
    for number in range(3):
        path = tmp_path / f"r{number}" / "metrics.jsonl"
        append_bytes(path, records(1, 200))
        paths.append(path)
    one = CachePolicy(tmp_path / "cache", min_records=1)
    reader = RunReader(paths[0], cache=one)
    reader.refresh()
    size = next((tmp_path / "cache").glob("*.mcc")).stat().st_size
    bounded = CachePolicy(tmp_path / "cache", min_records=1, max_total_bytes=2 * size + size // 2)
    for path in paths[1:]:
        RunReader(path, cache=bounded).refresh()
    assert len(list((tmp_path / "cache").glob("*.mcc"))) == 2
    tiny = CachePolicy(tmp_path / "tiny", min_records=1, max_file_bytes=size // 2)
    RunReader(paths[0], cache=tiny).refresh()
    assert not list((tmp_path / "tiny").glob("*.mcc"))


def test_load_refuses_a_cache_of_another_record_limit(
    tmp_path: Path, policy: CachePolicy, cache_loads: list[bool]
) -> None:
    """A cache parsed with another max_record_bytes may hold other bad lines: it is not used."""
    path = run_file(tmp_path)
    RunReader(path, cache=policy).refresh()
    reader = RunReader(path, cache=policy, max_record_bytes=100)
    reader.refresh()
    assert snapshot(reader) == snapshot(_refreshed(RunReader(path, max_record_bytes=100)))
    again = RunReader(path, cache=policy)  # the file now holds the 100-byte parse: refused again
    again.refresh()
    assert cache_loads == [False, False, False]  # no file yet, then each record limit refuses the other's
    assert snapshot(again) == cold(path)


def _refreshed(reader: RunReader) -> RunReader:
    reader.refresh()
    return reader
