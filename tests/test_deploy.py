"""The deployment files agree with the code: YAML parses, every command line parses with the real
CLI parser, services and ports line up. (CI has no Docker daemon: no image is built here.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deniable.cli.main import build_parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def compose() -> dict[str, Any]:
    return documents(DEPLOY / "compose.yaml")[0]


def k8s_containers() -> list[dict[str, Any]]:
    out = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in documents(path):
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            out.extend(c for c in spec.get("containers", []) if c["image"].startswith("deniable"))
    return out


def parses(argv: list[str]) -> Any:
    """The CLI's parse of a container's arguments (SystemExit on any unknown or bad option)."""
    return build_parser().parse_args(
        [a.replace("$(DENIABLE_POSTGRES_DSN)", "postgresql://u@h/d") for a in argv]
    )


@pytest.mark.parametrize("service", ["aggregator", "shuffler", "cli"])
def test_compose_commands_parse_with_the_cli(service: str) -> None:
    parses(compose()["services"][service]["command"])


def test_k8s_container_arguments_parse_with_the_cli() -> None:
    containers = k8s_containers()
    assert {c["name"] for c in containers} == {"aggregator", "shuffler"}
    for container in containers:
        args = parses(container["args"])
        listen_port = int(args.listen.rsplit(":", 1)[1])
        assert {"containerPort": listen_port, "name": "grpc"} in container["ports"]
        assert {"containerPort": args.metrics_port, "name": "metrics"} in container["ports"]
        assert container["volumeMounts"][0]["mountPath"] == str(args.data_dir)


def test_every_service_and_command_uses_tls() -> None:
    """No deployment file runs plaintext: TLS files everywhere, never --insecure."""
    commands = [c["command"] for c in compose()["services"].values() if "command" in c]
    commands += [c["args"] for c in k8s_containers()]
    for argv in commands:
        if argv[0] not in ("aggregator", "shuffler", "campaign", "query", "keys"):
            continue
        args = parses(argv)
        assert not args.insecure and args.tls_ca is not None, argv
        if argv[1] == "serve":
            assert args.tls_cert is not None and args.tls_key is not None, argv


def test_compose_wiring_agrees() -> None:
    services = compose()["services"]
    shuffler = parses(services["shuffler"]["command"])
    aggregator = parses(services["aggregator"]["command"])
    assert shuffler.upstream == f"aggregator:{aggregator.listen.rsplit(':', 1)[1]}"
    assert shuffler.mqtt == "mosquitto:1883"
    assert aggregator.store.startswith("postgresql://") and "@postgres:5432/" in aggregator.store
    listeners = [
        line for line in (DEPLOY / "mosquitto.conf").read_text().splitlines() if line.startswith("listener")
    ]
    assert listeners == ["listener 1883 0.0.0.0"]
    assert "set_tcp_nodelay true" in (DEPLOY / "mosquitto.conf").read_text()


def test_dockerfile_installs_every_package_folder() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    for folder in ("core", "client", "shuffler", "aggregator", "cli", "proto"):
        assert f"COPY {folder} {folder}" in text
    assert "USER deniable" in text and 'ENTRYPOINT ["deniable"]' in text
