"""Paths and loaders shared by the deploy/ tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("dev", "prod")
TOOLS = ROOT / ".venv-deploy-tools" / "bin"


def documents(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents in ``text``."""
    return [d for d in yaml.safe_load_all(text) if d]


def compose() -> dict[str, Any]:
    """deploy/compose.yaml."""
    return documents((DEPLOY / "compose.yaml").read_text())[0]


def kustomize(overlay: str) -> str:
    """``kubectl kustomize`` of an overlay (kubectl: the machine's, or Debian's via system-deps.sh)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is missing: scripts/system-deps.sh installs it"
    path = DEPLOY / "k8s" / "overlays" / overlay
    return subprocess.run(
        [kubectl, "kustomize", str(path)], check=True, capture_output=True, text=True
    ).stdout


def tool(name: str) -> str:
    """A linter from .venv-deploy-tools (scripts/deploy-tools.sh), else from PATH."""
    found = TOOLS / name if (TOOLS / name).exists() else shutil.which(name)
    assert found, f"{name} is missing: run scripts/deploy-tools.sh (scripts/test.sh does)"
    return str(found)


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Deployments and StatefulSets."""
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
