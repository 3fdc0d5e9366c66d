"""Public API of deniable.client and its import boundaries (randomness: tests/test_architecture.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.imports import lint_imports

import deniable.client.reporter

CLIENT_DIR = Path(deniable.client.reporter.__file__).parent
FORBIDDEN = ("deniable.shuffler", "deniable.aggregator")


def test_exports() -> None:
    import deniable.client as client

    expected = {
        "Reporter", "SendResult", "Outbox", "BudgetLedger", "BudgetExceeded", "CampaignClosed",
        "CampaignInvalid", "GrpcTransport", "HttpTransport", "InMemoryTransport", "Transport",
        "TransportError",
    }  # fmt: skip
    assert getattr(client, "__file__", None), (
        "deniable.client resolved as a namespace package: the editable install predates "
        "client/__init__.py; rerun `pip install -e .`"
    )
    assert expected <= set(client.__all__)
    assert all(hasattr(client, name) for name in client.__all__)


def test_source_never_imports_services() -> None:
    """import-linter's ``sides-independent`` and ``layers`` contracts (pyproject.toml, ADR 0028)."""
    code, output = lint_imports(["sides-independent", "layers"])
    assert code == 0, output


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
