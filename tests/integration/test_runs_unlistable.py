"""Run discovery where the OS refuses to list a directory (a real process without root's read
override): the refused entries are named and every other run is listed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import REPO, without_permission_override
from tests.support.dashboard import make_run

LISTING_SCRIPT = """
import json, sys
from metrics_core.roots.discovery import discover_runs, find_runs
listing = discover_runs(sys.argv[1])
print(json.dumps({"runs": [run.name for run in listing.runs], "found": [run.name for run in find_runs(sys.argv[1])],
                  "unreadable": [str(entry) for entry in listing.unreadable]}))
"""


def listed_under_modes(root: Path, modes: dict[Path, int]) -> dict[str, list[str]]:
    """What ``discover_runs`` and ``find_runs`` say of ``root`` in a process the file modes bind (root's
    override dropped), with ``modes`` set for the call and 0o755 restored after."""
    for path, mode in modes.items():
        path.chmod(mode)
    try:
        done = subprocess.run([*without_permission_override(), sys.executable, "-c", LISTING_SCRIPT, str(root)],
                              capture_output=True, text=True, timeout=60, cwd=REPO)  # fmt: skip
    finally:
        for path in modes:
            path.chmod(0o755)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_directories_the_os_refuses_to_list_are_named_and_every_other_run_is_listed(tmp_path: Path) -> None:
    """A chmod 000 run directory, one with a run below it and one that may be entered but not listed
    are named as permission denied; every other run is listed."""
    for name in ("a", "locked-run", "locked/inner", "group/b", "group/blind/c"):
        make_run(tmp_path / name)
    modes = {tmp_path / "locked-run": 0, tmp_path / "locked": 0, tmp_path / "group" / "blind": 0o311}  # 311: no list
    assert listed_under_modes(tmp_path, modes) == {
        "runs": ["a", "group/b"],
        "found": ["a", "group/b"],
        "unreadable": ["group/blind: permission denied", "locked: permission denied", "locked-run: permission denied"],
    }


def test_an_unlistable_root_is_named_as_dot(tmp_path: Path) -> None:
    """A root the process may not list is one unreadable entry, '.', not an exception."""
    make_run(tmp_path / "a")
    assert listed_under_modes(tmp_path, {tmp_path: 0o311}) == {
        "runs": [],
        "found": [],
        "unreadable": [".: permission denied"],
    }
