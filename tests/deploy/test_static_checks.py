"""Issue 11: the linters an SRE would run on deploy/, run by the default test command.

Tools come from scripts/deploy-tools.sh (pinned, own venv); each call takes about a second except
checkov (~3-5 s per file). Skipped checkov checks are listed with reasons in deploy/checkov.yaml.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import ModuleType

import pytest


def run(argv: list[str], cwd: Path | None = None) -> str:
    """Run a linter; the assertion message is its whole output."""
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def test_hadolint_passes_the_dockerfile(dp: ModuleType) -> None:
    run([dp.tool("hadolint"), "--failure-threshold", "info", str(dp.DEPLOY / "Dockerfile")])


def test_hadolint_catches_what_the_dockerfile_avoids(dp: ModuleType, tmp_path: Path) -> None:
    """The check can fail: the old image's unversioned base and `pip install` without a venv."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y curl\nUSER root\n")
    done = subprocess.run([dp.tool("hadolint"), str(bad)], capture_output=True, text=True)
    assert done.returncode != 0 and "DL3006" in done.stdout + done.stderr


def test_compose_file_matches_the_compose_spec(dp: ModuleType) -> None:
    compose = str(dp.DEPLOY / "compose.yaml")
    run([dp.tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", compose])


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_kustomize_output_validates_against_kubernetes_schemas(
    dp: ModuleType, rendered: dict[str, str], tmp_path: Path, overlay: str
) -> None:
    manifest = tmp_path / f"{overlay}.yaml"
    manifest.write_text(rendered[overlay])
    out = run([dp.tool("kubernetes-validate"), "--strict", "-k", "1.31.0", str(manifest)])
    assert "ERROR" not in out


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_checkov_passes_the_rendered_manifests(
    dp: ModuleType, rendered: dict[str, str], tmp_path: Path, overlay: str
) -> None:
    manifest = tmp_path / f"{overlay}.yaml"
    manifest.write_text(rendered[overlay])
    config = str(dp.DEPLOY / "checkov.yaml")
    out = run([dp.tool("checkov"), "-f", str(manifest), "--framework", "kubernetes", "--config-file", config])
    assert "Failed checks: 0" in out and "Passed checks: " in out, out


def test_checkov_passes_the_dockerfile(dp: ModuleType) -> None:
    config = str(dp.DEPLOY / "checkov.yaml")
    dockerfile = str(dp.DEPLOY / "Dockerfile")
    out = run([dp.tool("checkov"), "-f", dockerfile, "--framework", "dockerfile", "--config-file", config])
    assert "Failed checks: 0" in out, out
