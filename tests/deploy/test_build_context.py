"""The image build copies every package the wheel maps (a package added later must reach the image)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _package_folders() -> set[str]:
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {folder.split("/", 1)[0] for folder in mapping.values()}


def test_the_dockerfile_and_its_context_hold_every_mapped_package() -> None:
    """Before this test, ``console/`` was mapped in pyproject but neither copied nor let through
    .dockerignore, and ``pip install .`` in the build stage failed (package directory missing)."""
    copied = set(re.findall(r"^COPY (\S+) \1$", (ROOT / "deploy" / "Dockerfile").read_text(), re.M))
    allowed = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    folders = _package_folders()
    assert folders <= copied, f"not copied into the build stage: {sorted(folders - copied)}"
    assert folders <= allowed, f"left out of the build context by .dockerignore: {sorted(folders - allowed)}"
