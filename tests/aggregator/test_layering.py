"""The aggregator's layering: enforced by import-linter contracts (ADR 0028).

``sides-independent`` and ``layers`` (the aggregator imports only core and the stubs, never the
client, the shuffler, the CLI or sim) and ``handlers-without-grpc`` (handlers, store, decryption
and keys know nothing of gRPC) in ``pyproject.toml``; randomness is checked in
``tests/test_architecture.py``. This test runs those contracts alone so a failure names the aggregator.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_aggregator_contracts_are_kept() -> None:
    contracts = ["sides-independent", "layers", "handlers-without-grpc"]
    args = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache", "--no-logo"]
    args += [arg for contract in contracts for arg in ("--contract", contract)]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
