"""No shuffler workload can reach an aggregator-operator credential (issue 20, ADR 0030).

Renders both kustomize overlays and reads deploy/compose.yaml, then follows every way a workload
of the shuffler's party (the shuffler, its broker) could reach a file: Secret volumes (plain or
projected), env and envFrom Secret references, compose bind mounts and secrets, and paths in its
arguments. Secret contents come from deploy/k8s/dev-secrets.sh (which files each Secret is made
of) and deploy/dev-setup.sh (which files each certs/<holder> directory holds). A credential of the
aggregator's operator is any file or directory naming ``aggregator-operator`` or the removed
single ``operator`` role, which the aggregator accepted for every operator RPC.

The checker is shown to catch the old layout (the shuffler's preStop drain credential was the
aggregator's operator credential) on doctored copies of the deploy files.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

FORBIDDEN = re.compile(r"aggregator-operator|aggregator_operator|(^|[/\s=])operator(\.(pem|key)\b|/|$)")
"""A path, Secret or file of the aggregator's operator (or of the removed all-powerful role)."""
SHUFFLER_PARTY_APPS = ("deniable-shuffler", "mosquitto")
SHUFFLER_PARTY_SERVICES = ("shuffler", "mosquitto")


def holders(dev_setup: str) -> dict[str, list[str]]:
    """certs/<dir> -> the files dev-setup.sh installs there (its ``holder DIR OWNER FILE...`` lines)."""
    found: dict[str, list[str]] = {}
    for line in dev_setup.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 3 and words[0] == "holder" and words[1] != "DIR":
            found[words[1]] = words[3:]
    return found


def secret_sources(dev_secrets: str) -> dict[str, list[str]]:
    """Secret name -> the paths its ``secret NAME --from-file=...`` line reads (continuations joined)."""
    text = dev_secrets.replace("\\\n", " ")
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "secret" and not words[1].startswith("("):
            found[words[1]] = [w.split("=", 1)[1] for w in words[2:] if w.startswith("--from-file")]
    return found


def forbidden_paths(paths: list[str], files_of: dict[str, list[str]]) -> list[str]:
    """The paths (or the files of the certs/<dir> directories among them) that are forbidden."""
    bad = []
    for quoted in paths:
        path = quoted.strip("\"'").rstrip("/")
        directory = path.rsplit("/certs/", 1)[-1] if "/certs/" in path else ""
        for candidate in [path, *(f"{path}/{f}" for f in files_of.get(directory, []))]:
            if FORBIDDEN.search(candidate):
                bad.append(candidate)
    return bad


def _pod_secret_names(pod: dict[str, Any]) -> Iterator[str]:
    for volume in pod.get("volumes", []):
        if "secret" in volume:
            yield volume["secret"]["secretName"]
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                yield source["secret"]["name"]
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                yield ref["name"]
        for env_from in container.get("envFrom", []):
            if "secretRef" in env_from:
                yield env_from["secretRef"]["name"]


def _pod_strings(pod: dict[str, Any]) -> Iterator[str]:
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        yield from container.get("args", []) + container.get("command", [])
        yield from (str(e.get("value", "")) for e in container.get("env", []))
        yield from (str(m["mountPath"]) for m in container.get("volumeMounts", []))
        yield from yaml.safe_dump(container.get("lifecycle", {})).split()


def k8s_violations(
    docs: list[dict[str, Any]], secrets: dict[str, list[str]], files_of: dict[str, list[str]]
) -> list[str]:
    """What shuffler-party workloads of a rendered overlay can reach of the aggregator's operator."""
    found = []
    for workload in docs:
        if workload.get("kind") not in ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"):
            continue
        pod = workload["spec"]["template"]["spec"]
        app = workload["spec"]["template"]["metadata"].get("labels", {}).get("app", "")
        if app not in SHUFFLER_PARTY_APPS:
            continue
        for name in _pod_secret_names(pod):
            if FORBIDDEN.search(name):
                found.append(f"{app}: Secret {name}")
            for path in forbidden_paths(secrets.get(name, []), files_of):
                found.append(f"{app}: Secret {name} holds {path}")
        found += [f"{app}: refers to {s}" for s in _pod_strings(pod) if FORBIDDEN.search(s)]
    return found


def compose_violations(compose: dict[str, Any], files_of: dict[str, list[str]]) -> list[str]:
    """What shuffler-party compose services can reach of the aggregator's operator."""
    found = []
    declared = compose.get("secrets", {})
    for name in SHUFFLER_PARTY_SERVICES:
        service = compose["services"][name]
        mounts = [str(v).split(":", 1)[0] for v in service.get("volumes", [])]
        found += [f"{name}: mounts {p}" for p in forbidden_paths(mounts, files_of)]
        for secret in service.get("secrets", []):
            secret_name = secret if isinstance(secret, str) else secret["source"]
            source = str(declared.get(secret_name, {}).get("file", ""))
            if FORBIDDEN.search(secret_name) or forbidden_paths([source], files_of):
                found.append(f"{name}: secret {secret_name}")
        strings = [*service.get("command", []), *map(str, service.get("environment", {}).values())]
        found += [f"{name}: refers to {s}" for s in strings if FORBIDDEN.search(s)]
    return found


def check(deploy: Path, kubectl: str) -> list[str]:
    """Every violation in a deploy/ tree: both overlays rendered, and compose."""
    files_of = holders((deploy / "dev-setup.sh").read_text())
    secrets = secret_sources((deploy / "k8s" / "dev-secrets.sh").read_text())
    found = []
    for overlay in ("dev", "prod"):
        rendered = subprocess.run(
            [kubectl, "kustomize", str(deploy / "k8s" / "overlays" / overlay)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        docs = [d for d in yaml.safe_load_all(rendered) if d]
        found += [f"{overlay}: {v}" for v in k8s_violations(docs, secrets, files_of)]
    compose = yaml.safe_load((deploy / "compose.yaml").read_text())
    return found + [f"compose: {v}" for v in compose_violations(compose, files_of)]


@pytest.fixture(scope="module")
def kubectl() -> str:
    found = shutil.which("kubectl")
    assert found, "kubectl is missing: scripts/system-deps.sh installs it"
    return found


def test_no_shuffler_workload_reaches_an_aggregator_operator_credential(dp: ModuleType, kubectl: str) -> None:
    assert check(dp.DEPLOY, kubectl) == []


def test_the_files_say_who_holds_what(dp: ModuleType) -> None:
    """The checker reads real contents: the holders and Secrets it relies on exist as described."""
    files_of = holders((dp.DEPLOY / "dev-setup.sh").read_text())
    assert files_of["shuffler-operator"] == [
        "shuffler-operator.pem",
        "shuffler-operator.key",
        "shuffler-ca.pem",
    ]
    assert "aggregator-operator.key" in files_of["aggregator-operator"]
    assert not any(
        FORBIDDEN.search(f) for h in ("shuffler", "shuffler-operator", "mosquitto") for f in files_of[h]
    )
    secrets = secret_sources((dp.DEPLOY / "k8s" / "dev-secrets.sh").read_text())
    assert secrets["deniable-shuffler-operator"] == ['"$d/certs/shuffler-operator"']
    assert not any(FORBIDDEN.search(name) for name in secrets)  # no Secret of the aggregator's operator


def _doctored(dp: ModuleType, tmp_path: Path) -> Path:
    copy = tmp_path / "deploy"
    shutil.copytree(dp.DEPLOY, copy, ignore=shutil.ignore_patterns("certs", "secrets"))
    return copy


def test_the_checker_catches_the_old_drain_credential(dp: ModuleType, kubectl: str, tmp_path: Path) -> None:
    """The old layout: the Secret the shuffler's preStop drain mounts is the aggregator's operator
    credential (then: the one `operator` role). Both overlays are caught, through the Secret."""
    copy = _doctored(dp, tmp_path)
    script = copy / "k8s" / "dev-secrets.sh"
    text = script.read_text()
    old = 'secret deniable-shuffler-operator --from-file="$d/certs/shuffler-operator"'
    assert old in text
    script.write_text(
        text.replace(old, 'secret deniable-shuffler-operator --from-file="$d/certs/aggregator-operator"')
    )
    found = check(copy, kubectl)
    assert found and all(v.startswith(("dev: deniable-shuffler", "prod: deniable-shuffler")) for v in found)
    assert any("aggregator-operator.key" in v for v in found), found
    old_files = 'secret deniable-shuffler-operator --from-file="$d/certs/operator/operator.pem"'
    script.write_text(text.replace(old, old_files))  # the old file names, literally
    assert any("operator.pem" in v for v in check(copy, kubectl))


@pytest.mark.parametrize(
    ("target", "old", "new"),
    [
        (  # a compose bind mount of the aggregator's operator directory into the shuffler
            "compose.yaml",
            "      - ./certs/shuffler:/etc/deniable/tls:ro",
            "      - ./certs/shuffler:/etc/deniable/tls:ro\n      - ./certs/aggregator-operator:/op:ro",
        ),
        (  # a Secret of the aggregator's operator as an env variable of the shuffler
            "k8s/base/shuffler.yaml",
            "            - {name: DENIABLE_MQTT_PASSWORD_FILE, value: /etc/deniable/mqtt/password}",
            "            - {name: DENIABLE_MQTT_PASSWORD_FILE, value: /etc/deniable/mqtt/password}\n"
            "            - name: OP_KEY\n"
            "              valueFrom: {secretKeyRef: {name: deniable-aggregator-operator, key: key}}",
        ),
        (  # a projected volume mixing the drain credential with the aggregator operator's
            "k8s/base/shuffler.yaml",
            "          secret: {secretName: deniable-shuffler-operator, defaultMode: 0440}",
            "          projected:\n            defaultMode: 0440\n            sources:\n"
            "              - secret: {name: deniable-shuffler-operator}\n"
            "              - secret: {name: deniable-aggregator-operator}",
        ),
    ],
)
def test_the_checker_catches_other_ways_in(
    dp: ModuleType, kubectl: str, tmp_path: Path, target: str, old: str, new: str
) -> None:
    copy = _doctored(dp, tmp_path)
    path = copy / target
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    assert check(copy, kubectl), target
