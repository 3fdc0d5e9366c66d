"""Build the project's wheel for packaging tests (what a user would install), without dependencies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(directory: Path) -> None:
    """``pip wheel`` the checkout into ``directory`` (no deps, no build isolation: offline and quick)."""
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
