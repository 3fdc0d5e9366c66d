"""Run import-linter's ``lint-imports`` on chosen contracts of pyproject.toml (ADR 0028).

One invocation for every test that checks import contracts: the architecture suite and the
per-package tests of the client, shuffler and aggregator.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def lint_imports(
    contracts: Sequence[str], cwd: Path = ROOT, pythonpath: Path | None = None
) -> tuple[int, str]:
    """Run ``lint-imports`` on ``contracts`` from ``cwd``'s pyproject.toml; exit code and output."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    args = [LINT_IMPORTS, "--no-cache", "--no-logo", "--config", "pyproject.toml"]
    for contract in contracts:
        args += ["--contract", contract]
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout + result.stderr
