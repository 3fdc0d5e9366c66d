"""In CI (issue 12; `.ci/run` runs `pytest -m install` after the README's test command): the SDK
tests pass at the lowest versions we allow, and Deniable resolves next to the latest Flower
(scripts/lowest.sh, scripts/coinstall.sh; each one to three minutes with a warm cache, so they
sit behind the ``install`` marker to keep the default run short)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.install


def _script(name: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [str(ROOT / "scripts" / name)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def test_sdk_tests_pass_at_the_lowest_allowed_versions() -> None:
    result = _script("lowest.sh")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "installed grpcio 1.63.2" in result.stdout and "installed protobuf 5.26.1" in result.stdout


def test_deniable_and_the_latest_flower_resolve_together() -> None:
    result = _script("coinstall.sh")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resolves: deniable" in result.stdout
