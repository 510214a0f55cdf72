"""A venv holding this checkout as a user installs it: a wheel (``pip wheel . --no-deps``) installed
with its ``[app]`` extra into a fresh venv, nothing of the checkout on its path.

.ci/run builds it once, before the test command (``python metrics_core/testing/wheel_venv.py DIR``:
by path, as it needs the standard library alone, beside the install of the package's requirements),
and names it in ``$METRICS_WHEEL_VENV``; without that variable the ``wheel_venv`` fixture
(tests/conftest.py) builds one per test session.  The wheel is built from a copy of the checkout's
files: setuptools builds in ``build/`` of its source tree, where files of an earlier build would
ride along into the wheel.  Every process of the venv runs without ``PYTHONPATH``
(``outside_checkout``): a checkout on it (the developers' guide runs everything so) would be
imported instead of the wheel, and pip would take the checkout's ``*.egg-info`` of an editable
install for the package already installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Never part of a build: version control, local venvs, caches, earlier builds, runs.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "runs"
)


def outside_checkout(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` without ``PYTHONPATH``: a process that imports what its own venv holds, not this checkout."""
    return {name: value for name, value in environ.items() if name != "PYTHONPATH"}


def build_wheel_venv(directory: Path, *, python: str = sys.executable) -> Path:
    """Build the wheel of this checkout in ``directory`` and install it with ``[app]`` into the venv
    ``directory/venv``; return the venv.  Dependencies come from pip's index and cache; ``--no-compile``:
    pip would byte-compile every installed module (plotly has thousands), which Python does anyway
    for the few a server imports."""
    source = directory / "source"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCE)
    wheels = directory / "dist"
    env = outside_checkout(dict(os.environ))
    subprocess.run(
        [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(source)],
        check=True,
        timeout=600,
        env=env,
    )
    [wheel] = wheels.glob("metrics_core-*.whl")
    venv = directory / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", f"{wheel}[app]"],
        check=True,
        timeout=1200,
        env=env,
        cwd=directory,
    )
    return venv


def installed_package(venv: Path) -> Path:
    """Where ``venv``'s python imports ``metrics_core`` from, run outside the checkout and without
    ``PYTHONPATH``, as a user runs it."""
    command = [str(venv / "bin" / "python"), "-c", "import metrics_core; print(metrics_core.__file__)"]
    found = subprocess.run(command, cwd=venv, env=outside_checkout({}), capture_output=True, text=True, check=True)
    return Path(found.stdout.strip()).resolve().parent


def checked_wheel_venv(venv: Path) -> Path:
    """``venv`` once its python imports the installed wheel (``metrics_core`` inside the venv), else
    a ``RuntimeError`` naming where it imports it from instead."""
    package = installed_package(venv)
    if not package.is_relative_to(venv.resolve()):
        raise RuntimeError(f"{venv} imports metrics_core from {package}, not from the wheel installed in it")
    return venv


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m metrics_core.testing.wheel_venv DIR  (builds DIR/venv; DIR must not exist)")
    print(checked_wheel_venv(build_wheel_venv(Path(sys.argv[1]).resolve())))
