"""The aggregator's layering: enforced by import-linter contracts (ADR 0028).

``sides-independent`` and ``layers`` (the aggregator imports only core and the stubs, never the
client, the shuffler, the CLI or sim) and ``handlers-without-grpc`` (handlers, store, decryption
and keys know nothing of gRPC) in ``pyproject.toml``; randomness is checked in
``tests/test_architecture.py``. This test runs those contracts alone so a failure names the aggregator.
"""

from __future__ import annotations

from support.imports import lint_imports


def test_aggregator_contracts_are_kept() -> None:
    contracts = ["sides-independent", "layers", "handlers-without-grpc"]
    code, output = lint_imports(contracts)
    assert code == 0, output
