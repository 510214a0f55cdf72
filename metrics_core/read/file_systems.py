"""Which file systems carry a writer's lock for certain: where a free lock is a dead writer.

A ``MetricsWriter`` holds an OFD lock on its file for as long as its process lives
(``metrics_core.write.crash_safety``); the kernel drops it the moment the process dies, SIGKILL
included.  On a file system local to this host, every writer of a file is a process of this
kernel, so a free lock on a run with no ``session_end`` is a crash, known at once.  Over NFS,
Lustre, GPFS or FUSE a lock may be emulated, dropped by a lease, or not carried at all; there the
reader keeps to the heartbeat until it has seen the lock held once (``run_status``).

The type of the file system holding a path comes from ``/proc/self/mountinfo``, matched on the
path's device (``st_dev``), read once per process and again only for a device it does not list;
anything it cannot tell (another OS, a device not listed) counts as not local.
"""

from __future__ import annotations

import os
from pathlib import Path

# Block-device and in-memory file systems of one kernel: a lock there is seen by every process
# that can open the file.
LOCAL_TYPES = frozenset(
    ("ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "reiserfs", "bcachefs", "tmpfs", "ramfs", "overlay")
)
MOUNTINFO = Path("/proc/self/mountinfo")

_types: dict[Path, dict[int, str]] = {}  # by mountinfo file: each device's type, "" for one not listed


def _read_mountinfo(mountinfo: Path) -> dict[int, str]:
    """Each mount's device number to its file system type: a mountinfo line is ``id parent
    major:minor root mountpoint options [optional…] - fstype source superoptions``."""
    types: dict[int, str] = {}
    try:
        text = mountinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return types
    for line in text.splitlines():
        fields = line.split()
        try:
            major, minor = fields[2].split(":")
            fstype = fields[fields.index("-", 6) + 1]
        except (IndexError, ValueError):
            continue
        types.setdefault(os.makedev(int(major), int(minor)), fstype)
    return types


def file_system_type(path: Path, *, mountinfo: Path = MOUNTINFO) -> str | None:
    """The type of the file system ``path`` lies on (``ext4``, ``nfs4``, ``fuse.sshfs`` …); None
    when it cannot be told."""
    try:
        device = os.stat(path).st_dev
    except OSError:
        return None
    types = _types.setdefault(mountinfo, {})
    if device not in types:
        types.update(_read_mountinfo(mountinfo))
        types.setdefault(device, "")  # not listed: not looked for again
    return types[device] or None


def locks_are_certain(path: Path) -> bool:
    """Whether a writer's lock on ``path`` is held exactly while its process lives: the file lies on
    a file system local to this host (``LOCAL_TYPES``)."""
    return file_system_type(path) in LOCAL_TYPES
