"""The aggregator imports only core and the stubs; its handlers know nothing of gRPC."""

from __future__ import annotations

import ast
from pathlib import Path

from support import astutil

import deniable.aggregator

PACKAGE = Path(deniable.aggregator.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = astutil.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_aggregator_never_imports_client_or_shuffler() -> None:
    for path in PACKAGE.glob("*.py"):
        for name in imported_modules(path):
            assert not name.startswith(("deniable.client", "deniable.shuffler", "deniable.cli")), (path, name)


def test_handlers_store_and_decrypt_are_free_of_grpc() -> None:
    for module in ("handlers.py", "store.py", "decrypt.py", "keys.py"):
        names = imported_modules(PACKAGE / module)
        assert not any(n == "grpc" or n.startswith("grpc.") for n in names), module


def test_no_insecure_randomness_in_production_code() -> None:
    for path in PACKAGE.glob("*.py"):
        names = imported_modules(path)
        assert "random" not in names and "numpy.random" not in names, path
        assert "np.random" not in path.read_text(), path
