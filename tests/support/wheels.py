"""Build the project's wheel for packaging tests (what a user would install), without dependencies."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(directory: Path) -> None:
    """``pip wheel`` the checkout into ``directory`` (no deps, no build isolation: offline and quick).

    setuptools writes ``build/`` and the egg-info inside the checkout, so builds from parallel test
    workers (pytest -n) take turns on a lock file."""
    (ROOT / "build").mkdir(exist_ok=True)
    with (ROOT / "build" / ".wheel.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _pip_wheel(directory)


def _pip_wheel(directory: Path) -> None:
    """The build itself (under the lock)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(directory),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
