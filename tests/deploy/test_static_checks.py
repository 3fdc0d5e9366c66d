"""Issue 11: the linters an SRE would run on deploy/, run by the default test command.

Tools come from scripts/deploy-tools.sh (pinned, own venv); each call takes about a second except
checkov (~3-8 s, one run). Skipped checkov checks are listed with reasons in deploy/checkov.yaml.
"""

from __future__ import annotations

import json
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


BAD_POD = """apiVersion: v1
kind: Pod
metadata: {name: bad}
spec:
  containers:
    - {name: c, image: "x:1", securityContext: {privileged: true}}
"""


def test_checkov_passes_both_overlays_and_the_dockerfile_and_catches_a_bad_pod(
    dp: ModuleType, rendered: dict[str, str], tmp_path: Path
) -> None:
    """One checkov run (it costs seconds to start): failures only in the planted privileged pod."""
    files = []
    for name, text in {**rendered, "bad": BAD_POD}.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        files += ["-f", str(tmp_path / f"{name}.yaml")]
    config = str(dp.DEPLOY / "checkov.yaml")
    argv = [dp.tool("checkov"), *files, "-f", str(dp.DEPLOY / "Dockerfile"), "--config-file", config]
    done = subprocess.run(
        [*argv, "--framework", "kubernetes", "dockerfile", "-o", "json"], capture_output=True, text=True
    )
    reports = json.loads(done.stdout)
    failed = {
        report["check_type"]: {Path(f["file_path"]).name for f in report["results"]["failed_checks"]}
        for report in (reports if isinstance(reports, list) else [reports])
    }
    assert failed == {"kubernetes": {"bad.yaml"}, "dockerfile": set()}, done.stdout[-4000:]
