"""Public API of deniable.client and its import boundaries."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from support import astutil

import deniable.client.reporter

CLIENT_DIR = Path(deniable.client.reporter.__file__).parent
FORBIDDEN = ("deniable.shuffler", "deniable.aggregator")


def test_exports() -> None:
    import deniable.client as client

    expected = {
        "Reporter", "SendResult", "Outbox", "BudgetLedger", "BudgetExceeded", "CampaignClosed",
        "CampaignInvalid", "GrpcTransport", "InMemoryTransport", "Transport", "TransportError",
    }  # fmt: skip
    assert getattr(client, "__file__", None), (
        "deniable.client resolved as a namespace package: the editable install predates "
        "client/__init__.py; rerun `pip install -e .`"
    )
    assert expected <= set(client.__all__)
    assert all(hasattr(client, name) for name in client.__all__)


def test_source_never_imports_services() -> None:
    for source in CLIENT_DIR.glob("*.py"):
        for node in ast.walk(astutil.parse(source.read_text(), str(source))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not [n for n in names if n.startswith(FORBIDDEN)], f"{source.name} imports {names}"


def test_loading_the_client_loads_no_service() -> None:
    modules = ["deniable.client." + p.stem for p in CLIENT_DIR.glob("*.py") if p.stem != "__init__"]
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = json.loads(out)
    assert [m for m in loaded if m.startswith(FORBIDDEN)] == []


def test_no_insecure_randomness_in_client() -> None:
    for source in CLIENT_DIR.glob("*.py"):
        for node in ast.walk(astutil.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                assert all(a.name != "random" and not a.name.startswith("numpy.random") for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert node.module not in ("random", "numpy.random"), source.name
                assert not (node.module == "numpy" and any(a.name == "random" for a in node.names))
