"""The deployment files agree with the code and with the issue 11 rules: command lines parse with the
real CLI parser, TLS everywhere, secrets never in argv, parties on separate networks, workloads that
the Pod Security "restricted" profile admits. (No Docker engine or cluster here: checked statically.)"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import pytest

from deniable.cli.main import build_parser

SECRETS_IN_ARGV = re.compile(r"postgresql://|password", re.IGNORECASE)


def parses(argv: list[str]) -> Any:
    """The CLI's parse of a container's arguments (SystemExit on any unknown or bad option)."""
    return build_parser().parse_args(argv)


def k8s_docs(dp: ModuleType, rendered: dict[str, str], overlay: str) -> list[dict[str, Any]]:
    return list(dp.documents(rendered[overlay]))


def deniable_containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        c
        for w in docs
        if w["kind"] in ("Deployment", "StatefulSet")
        for c in w["spec"]["template"]["spec"]["containers"]
        if "deniable" in c["image"]
    ]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


# --- compose -------------------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["aggregator", "shuffler", "cli"])
def test_compose_commands_parse_with_the_cli(dp: ModuleType, service: str) -> None:
    parses(dp.compose()["services"][service]["command"])


def test_every_service_and_command_uses_tls(dp: ModuleType, rendered: dict[str, str]) -> None:
    """No deployment file runs plaintext: TLS files everywhere, never --insecure."""
    commands = [c["command"] for c in dp.compose()["services"].values() if "command" in c]
    for overlay in dp.OVERLAYS:
        commands += [c["args"] for c in deniable_containers(k8s_docs(dp, rendered, overlay))]
    assert len(commands) >= 7
    for argv in commands:
        if argv[0] not in ("aggregator", "shuffler", "campaign", "query", "keys"):
            continue
        args = parses(argv)
        assert not args.insecure and args.tls_ca is not None, argv
        if argv[1] == "serve":
            assert args.tls_cert is not None and args.tls_key is not None, argv


def test_compose_wiring_agrees(dp: ModuleType) -> None:
    services = dp.compose()["services"]
    shuffler = parses(services["shuffler"]["command"])
    aggregator = parses(services["aggregator"]["command"])
    assert shuffler.upstream == f"aggregator:{aggregator.listen.rsplit(':', 1)[1]}"
    assert shuffler.mqtt == "mosquitto:8883" and shuffler.mqtt_ca is not None and not shuffler.mqtt_insecure
    conf = (dp.DEPLOY / "mosquitto.conf").read_text()
    # TLS listener only (issue 20): no plaintext port is configured or published
    assert [line for line in conf.splitlines() if line.startswith("listener")] == ["listener 8883 0.0.0.0"]
    assert "certfile /mosquitto/certs/mqtt-broker.pem" in conf and "keyfile" in conf
    assert services["mosquitto"]["ports"] == ["8883:8883"]
    assert "set_tcp_nodelay true" in conf and "allow_anonymous false" in conf and "acl_file" in conf


def test_compose_secrets_come_from_files_never_argv(dp: ModuleType) -> None:
    """Contract change (issue 11): the DSN moved from --store=postgresql://... to a secret file."""
    doc = dp.compose()
    services, declared = doc["services"], doc["secrets"]
    for name, service in services.items():
        assert not SECRETS_IN_ARGV.search(" ".join(service.get("command", []))), name
        for key, value in service.get("environment", {}).items():
            assert "PASSWORD" not in key or key.endswith("_FILE"), (name, key)
            if key.endswith("_FILE"):
                secret = value.removeprefix("/run/secrets/")
                assert secret in declared and secret in service["secrets"], (name, key)
    aggregator = parses(services["aggregator"]["command"])
    assert aggregator.store is None and aggregator.store_file is None
    assert services["aggregator"]["environment"]["DENIABLE_STORE_FILE"].startswith("/run/secrets/")


def test_compose_parties_are_on_separate_networks(dp: ModuleType) -> None:
    doc = dp.compose()
    nets = {name: set(s.get("networks", [])) for name, s in doc["services"].items()}
    assert nets["postgres"] == {"db"} and "db" in nets["aggregator"]
    assert not nets["aggregator"] & {"devices"} and not nets["shuffler"] & {"db", "operators"}
    assert nets["mosquitto"] == {"devices"}
    assert nets["aggregator"] & nets["shuffler"] == {"ingest", "metrics"}
    assert doc["networks"]["ingest"]["internal"] and doc["networks"]["db"]["internal"]
    assert "ports" not in doc["services"]["postgres"]
    assert all(p.startswith("127.0.0.1:") for p in doc["services"]["aggregator"]["ports"])


def test_prometheus_scrapes_both_metrics_ports(dp: ModuleType) -> None:
    services = dp.compose()["services"]
    config = dp.documents((dp.DEPLOY / "prometheus" / "prometheus.yml").read_text())[0]
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    ports = {f"{s}:{parses(services[s]['command']).metrics_port}" for s in ("aggregator", "shuffler")}
    assert targets == ports
    assert "metrics" in services["prometheus"]["networks"]


# --- Dockerfile ----------------------------------------------------------------------------------


def dockerfile_stages(dp: ModuleType) -> dict[str, str]:
    """Stage name -> its text (continuation lines joined)."""
    text = (dp.DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    stages: dict[str, str] = {}
    for chunk in re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]:
        stages[chunk.split()[2]] = chunk
    return stages


def test_dockerfile_is_multi_stage_with_a_target_per_service(dp: ModuleType) -> None:
    stages = dockerfile_stages(dp)
    assert {"build", "runtime", "aggregator", "shuffler", "cli"} <= set(stages)
    for folder in ("core", "client", "shuffler", "aggregator", "cli", "proto"):
        assert f"COPY {folder} {folder}" in stages["build"]
    assert "pip install" not in stages["runtime"] and "build-ca" not in stages["runtime"]
    # each copies only its build stage's virtualenv: the services the lean one, the cli the full one
    venvs = {"aggregator": "build-server", "shuffler": "build-server", "cli": "build-services"}
    for service, venv in venvs.items():
        copies = re.findall(r"^COPY .*$", stages[service], re.MULTILINE)
        assert copies == [f"COPY --from={venv} /opt/deniable /opt/deniable"], copies
        assert "pip install" not in stages[service] and "build-ca" not in stages[service]
    # the services' venv leaves PyNaCl and the aiohttp family out (tests/test_server_dependencies.py)
    removed = stages["build-server"].split("rm -rf", 1)[1]
    for package in ("nacl", "[Pp]y[Nn]a[Cc]l-*", "aiohttp", "multidict*", "yarl*", "frozenlist*"):
        assert f'"$site"/{package}' in removed, package
    assert "[server" in stages["build"] and "scipy" not in stages["build"]
    for name, service in dp.compose()["services"].items():
        target = service.get("build", {}).get("target")
        assert target is None or target in stages, name


def test_image_runs_as_numeric_user_and_owns_its_data_dirs(dp: ModuleType) -> None:
    runtime = dockerfile_stages(dp)["runtime"]
    assert re.search(r"^USER 10001:10001$", runtime, re.MULTILINE)
    for directory in ("/var/lib/deniable/aggregator", "/var/lib/deniable/shuffler"):
        assert directory in runtime.split("mkdir -p", 1)[1].split("&&", 1)[0]
    assert "chown -R 10001:10001 /var/lib/deniable" in runtime


@pytest.mark.parametrize("service", ["aggregator", "shuffler"])
def test_healthcheck_and_cmd_parse_with_the_cli(dp: ModuleType, service: str) -> None:
    stage = dockerfile_stages(dp)[service]
    health = re.search(r"HEALTHCHECK .*?CMD (\[.*?\])", stage)
    cmd = re.search(r"^CMD (\[.*?\])", stage, re.MULTILINE)
    assert health and cmd
    argv = eval(health.group(1))
    assert argv[:2] == ["deniable", "health"]
    args = parses(argv[1:])
    assert args.tls_ca is not None and not args.insecure
    served = parses(eval(cmd.group(1)))
    # The shuffler is probed on its operator port (ADR 0032): strangers on the device port cannot fail it.
    probed = served.operator_listen if service == "shuffler" else served.listen
    assert args.address == f"127.0.0.1:{probed.rsplit(':', 1)[1]}"
    assert args.tls_cert is not None and args.tls_key is not None  # mutual TLS ports


# --- Kubernetes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_k8s_container_arguments_parse_with_the_cli(
    dp: ModuleType, rendered: dict[str, str], overlay: str
) -> None:
    containers = deniable_containers(k8s_docs(dp, rendered, overlay))
    assert {c["name"] for c in containers} == {"aggregator", "shuffler"}
    for container in containers:
        args = parses(container["args"])
        listen_port = int(args.listen.rsplit(":", 1)[1])
        assert {"containerPort": listen_port, "name": "grpc"} in container["ports"]
        assert {"containerPort": args.metrics_port, "name": "metrics"} in container["ports"]
        assert container["volumeMounts"][0]["mountPath"] == str(args.data_dir)
        assert not SECRETS_IN_ARGV.search(" ".join(container["args"]))
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert "grpc" not in container[probe]  # kubelet gRPC probes cannot speak TLS
            if "exec" in container[probe]:
                command = container[probe]["exec"]["command"]
                assert command[:2] == ["deniable", "health"] and parses(command[1:]).tls_ca


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_workloads_pass_pod_security_restricted(
    dp: ModuleType, rendered: dict[str, str], overlay: str
) -> None:
    docs = k8s_docs(dp, rendered, overlay)
    namespaces = by_kind(docs, "Namespace")
    assert [ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] for ns in namespaces.values()] == [
        "restricted"
    ]
    for workload in dp.workloads(docs):
        pod = workload["spec"]["template"]["spec"]
        name = workload["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] >= 10000, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["capabilities"] == {"drop": ["ALL"]}, name
            assert ctx["readOnlyRootFilesystem"] is True, name
            assert set(container["resources"]) == {"requests", "limits"}, name
            assert ":" in container["image"], f"{name}: overlay sets no image tag"
        assert not any("hostPath" in v or "hostNetwork" in v for v in pod.get("volumes", [])), name
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), name


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_statefulsets_have_headless_services_and_every_workload_a_pdb(
    dp: ModuleType, rendered: dict[str, str], overlay: str
) -> None:
    docs = k8s_docs(dp, rendered, overlay)
    services = by_kind(docs, "Service")
    pdbs = [p["spec"]["selector"]["matchLabels"] for p in by_kind(docs, "PodDisruptionBudget").values()]
    for workload in dp.workloads(docs):
        labels = workload["spec"]["selector"]["matchLabels"]
        assert labels in pdbs, workload["metadata"]["name"]
        if workload["kind"] == "StatefulSet":
            governing = services[workload["spec"]["serviceName"]]
            assert governing["spec"]["clusterIP"] == "None"
            assert governing["spec"]["selector"] == labels


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_shuffler_drains_scales_and_is_the_only_device_entry(
    dp: ModuleType, rendered: dict[str, str], overlay: str
) -> None:
    docs = k8s_docs(dp, rendered, overlay)
    shuffler = by_kind(docs, "StatefulSet")["shuffler"]
    container = shuffler["spec"]["template"]["spec"]["containers"][0]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    flush = parses(pre_stop[1:])
    assert pre_stop[0] == "deniable" and (flush.command, flush.action) == ("shuffler", "flush")
    assert not flush.below_n_min  # draining never forces a batch below n_min
    assert flush.shuffler.endswith(":7702") and flush.tls_cert is not None
    hpa = by_kind(docs, "HorizontalPodAutoscaler")["shuffler"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "shuffler",
    }
    exposed = [
        s for s in by_kind(docs, "Service").values() if s["spec"].get("type") in ("LoadBalancer", "NodePort")
    ]
    assert [(s["metadata"]["name"], [p["port"] for p in s["spec"]["ports"]]) for s in exposed] == [
        ("shuffler-devices", [7701])
    ]
    assert not by_kind(docs, "Ingress")


def _allowed_from(policy: dict[str, Any], port: int) -> list[Any]:
    return [
        rule.get("from")
        for rule in policy["spec"].get("ingress", [])
        if {"port": port, "protocol": "TCP"} in rule["ports"]
    ]


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_network_policies_separate_the_parties(
    dp: ModuleType, rendered: dict[str, str], overlay: str
) -> None:
    policies = by_kind(k8s_docs(dp, rendered, overlay), "NetworkPolicy")
    assert policies["default-deny"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    shufflers_and_operators = [
        {"podSelector": {"matchLabels": {"app": "deniable-shuffler"}}},
        {"podSelector": {"matchLabels": {"deniable.dev/role": "aggregator-operator"}}},
    ]
    assert _allowed_from(policies["shuffler"], 7702) == [
        [{"podSelector": {"matchLabels": {"deniable.dev/role": "shuffler-operator"}}}]
    ]
    assert _allowed_from(policies["aggregator"], 7700) == [shufflers_and_operators]
    assert _allowed_from(policies["postgres"], 5432) == [
        [{"podSelector": {"matchLabels": {"app": "deniable-aggregator"}}}]
    ]
    assert _allowed_from(policies["shuffler"], 7701) == [None]  # devices: from anywhere
    for name, policy in policies.items():  # nothing else is open to everyone
        for rule in policy["spec"].get("ingress", []):
            if rule.get("from") is None:
                assert (name, rule["ports"]) in (
                    ("shuffler", [{"port": 7701, "protocol": "TCP"}]),
                    ("mosquitto", [{"port": 8883, "protocol": "TCP"}]),
                )


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_keys_come_from_secrets_in_a_mode_the_services_accept(
    dp: ModuleType, rendered: dict[str, str], overlay: str
) -> None:
    """Secret files are root:fsGroup 0440; the aggregator's volume keys become fsGroup-group files,
    which it accepts only for the group named by DENIABLE_KEY_GROUP (tests/deploy/test_container_users.py)."""
    for workload in dp.workloads(k8s_docs(dp, rendered, overlay)):
        pod = workload["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] == 0o440, volume
        if workload["metadata"]["name"] == "aggregator":
            env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
            assert env["DENIABLE_KEY_GROUP"] == str(pod["securityContext"]["fsGroup"])
            assert env["DENIABLE_STORE_FILE"].startswith("/etc/deniable/store/")


def test_overlays_set_the_image_references(dp: ModuleType, rendered: dict[str, str]) -> None:
    images = {
        overlay: sorted(c["image"] for c in deniable_containers(k8s_docs(dp, rendered, overlay)))
        for overlay in dp.OVERLAYS
    }
    assert images["dev"] == ["deniable-aggregator:dev", "deniable-shuffler:dev"]
    assert all(i.startswith("registry.example.com/deniable/") for i in images["prod"])
    dev_compose = {s.get("image") for s in dp.compose()["services"].values()}
    assert set(images["dev"]) <= dev_compose  # the dev overlay runs what compose builds
