"""A venv holding this checkout as a user installs it: a wheel (``pip wheel . --no-deps``) installed
with its ``[app]`` extra into a fresh venv, nothing of the checkout on its path.

.ci/run builds it once, before the test command (``python tests/wheel_venv.py DIR``), and names it
in ``$METRICS_WHEEL_VENV``; without that variable the ``wheel_venv`` fixture (conftest) builds one
per test session.  The wheel is built from a copy of the checkout's files: setuptools builds in
``build/`` of its source tree, where files of an earlier build would ride along into the wheel.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Never part of a build: version control, local venvs, caches, earlier builds, runs.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "runs"
)


def build_wheel_venv(directory: Path, *, python: str = sys.executable) -> Path:
    """Build the wheel of this checkout in ``directory`` and install it with ``[app]`` into the venv
    ``directory/venv``; return the venv.  Dependencies come from pip's index and cache; ``--no-compile``:
    pip would byte-compile every installed module (plotly has thousands), which Python does anyway
    for the few a server imports."""
    source = directory / "source"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCE)
    wheels = directory / "dist"
    subprocess.run([python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(source)],
                   check=True, timeout=600)  # fmt: skip
    [wheel] = wheels.glob("metrics_core-*.whl")
    venv = directory / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", f"{wheel}[app]"],
                   check=True, timeout=1200)  # fmt: skip
    return venv


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/wheel_venv.py DIR  (builds DIR/venv; DIR must not exist)")
    print(build_wheel_venv(Path(sys.argv[1]).resolve()))
