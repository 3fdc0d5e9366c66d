"""Readiness probes use the shuffler's operator port (issue 20, item 3; ADR 0032): strangers who
fill the device port can never make a shuffler look unready, and the probe's ``Check`` is never
refused as a device-port ``Watch`` would be."""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import pytest

from deniable.cli.main import build_parser

OPERATOR_PORT = 7702


def _shuffler(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = [
        c
        for w in docs
        if w["kind"] in ("Deployment", "StatefulSet")
        for c in w["spec"]["template"]["spec"]["containers"]
        if c["name"] == "shuffler"
    ]
    return dict(container)


def _probe_targets_operator_port(command: list[str]) -> None:
    assert command[:2] == ["deniable", "health"], command
    args = build_parser().parse_args(command[1:])
    assert args.address.rsplit(":", 1)[1] == str(OPERATOR_PORT), command
    assert args.tls_cert is not None and args.tls_key is not None, "the operator port is mutual TLS"


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_kubernetes_readiness_probes_the_operator_port(
    dp: ModuleType, rendered: dict[str, str], overlay: str
) -> None:
    shuffler = _shuffler(list(dp.documents(rendered[overlay])))
    serve = build_parser().parse_args(shuffler["args"])
    assert serve.operator_listen.rsplit(":", 1)[1] == str(OPERATOR_PORT)
    _probe_targets_operator_port(shuffler["readinessProbe"]["exec"]["command"])


def test_the_shuffler_image_healthcheck_probes_the_operator_port(dp: ModuleType) -> None:
    """The compose stack's shuffler inherits the image's HEALTHCHECK (no override in compose)."""
    dockerfile = (dp.DEPLOY / "Dockerfile").read_text()
    stage = dockerfile.split("AS shuffler", 1)[1].split("\nFROM ", 1)[0]
    found = re.search(r"HEALTHCHECK[^\n]*\\\n\s*CMD (\[.*?\])\n", stage, re.S)
    assert found, "the shuffler stage has no HEALTHCHECK"
    command = [part.strip().strip('"') for part in found.group(1).strip("[]").replace("\\\n", "").split(",")]
    _probe_targets_operator_port(command)
    assert "healthcheck" not in dp.compose()["services"]["shuffler"]
