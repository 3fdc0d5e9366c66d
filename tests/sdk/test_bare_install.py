"""The device SDK runs without any server dependency (ADR 0017) and, over HTTPS, without grpcio
(ADR 0033) nor cryptography (ADR 0039: it seals and verifies on PyNaCl).

The default run sends a report from a subprocess where numpy, tqdm, prometheus-client, aiomqtt,
asyncpg, matplotlib, scipy and grpc-health are unimportable (over gRPC; over HTTPS grpc, cryptography
and the services' HTTP stacks, aiohttp and hypercorn with h2 and h11, too); the default run also
builds the wheel, installs it with no extras into a fresh venv, checks it stays under BARE_LIMIT_MB
and sends over HTTPS from there.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest
from support.sdk_services import Services, binary_campaign, counted, running_services
from support.wheels import build_wheel

from deniable.shuffler.https import HttpsConfig
from deniable.sim.bench_footprint import site_packages_mb

ROOT = Path(__file__).resolve().parents[2]
DEVICE = Path(__file__).with_name("device_script.py")
FORBIDDEN = (
    "numpy",
    "scipy",
    "matplotlib",
    "asyncpg",
    "prometheus-client",
    "aiomqtt",
    "tqdm",
    "paho-mqtt",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-grpc",
    "grpcio",
    "grpcio-health-checking",
    "aiohttp",
    "cryptography",
    "hypercorn",
    "h2",
    "h11",
)
BARE_LIMIT_MB = 14.0
"""A ceiling on the bare device SDK's installed size (site-packages without pip and setuptools):
12.2 MB when measured with PyNaCl instead of cryptography (ADR 0039: 23.1 MB before, 42.5 MB with
grpcio before ADR 0033), under issue 21's 20 MB target. PyNaCl 4.2 MB, our code 3.7 with bytecode,
protobuf 2.4, cffi with pycparser 1.7."""
HTTPS = HttpsConfig(listen="127.0.0.1:0")


async def _send(python: str, services: Services, tmp_path: Path, *extra: str) -> dict[str, object]:
    """Run the device script with ``python`` (``--https``: through the HTTPS endpoint); its JSON result."""
    assert services.shuffler is not None
    https = f"https://{services.shuffler.https_address}"
    proc = await asyncio.create_subprocess_exec(
        python,
        str(DEVICE),
        https if "--https" in extra else services.shuffler_address,
        "bare-sdk",
        str(tmp_path / "outbox.db"),
        "1",
        str(services.certs / "shuffler-ca.pem"),
        services.signing_key,
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    result: dict[str, object] = json.loads(out.decode().strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("transport", ["grpc", "https"])
async def test_a_device_without_server_packages_sends_a_counted_report(
    tmp_path: Path, transport: str
) -> None:
    """With every server-only package blocked (over HTTPS grpc too) the device fetches, seals and
    sends; it is counted. Without the lazy imports the script dies at ``import deniable.client``
    (numpy, tqdm; over HTTPS grpc, imported by the gRPC transport and core.plumbing.tls)."""
    async with running_services(tmp_path, [binary_campaign("bare-sdk")], https=HTTPS) as services:
        flags = ("--block", "--https") if transport == "https" else ("--block",)
        result = await _send(sys.executable, services, tmp_path, *flags)
        assert result == {"acknowledged": 1, "pending": 0, "loaded": []}
        answer = await counted(services, "bare-sdk", 1)
        assert answer.n == 1 and answer.rejected == 0


def _bare_venv(tmp_path: Path) -> Path:
    """Build the wheel and install it, no extras, into a fresh venv (pip cache reused); its python."""
    wheels = tmp_path / "wheels"
    build_wheel(wheels)
    wheel = next(wheels.glob("deniable-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True, timeout=600
    )
    return python


async def test_the_wheel_without_extras_installs_no_server_package_and_sends(tmp_path: Path) -> None:
    """``pip install deniable`` (the built wheel, no extras) into a fresh venv: none of the
    server-only distributions nor grpcio nor cryptography is installed, it takes under
    BARE_LIMIT_MB, GrpcTransport says which extra it needs, and a report sent from there over
    HTTPS (sealed and verified on PyNaCl) is counted."""
    python = await asyncio.to_thread(_bare_venv, tmp_path)
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json"], check=True, capture_output=True, text=True
    )
    installed = {d["name"].lower() for d in json.loads(listing.stdout)}
    assert "deniable" in installed
    assert installed.isdisjoint(FORBIDDEN), installed & set(FORBIDDEN)
    assert site_packages_mb(python) < BARE_LIMIT_MB
    no_grpc = subprocess.run(
        [str(python), "-c", "import deniable.client as c; c.GrpcTransport"], capture_output=True, text=True
    )
    assert no_grpc.returncode == 1 and "pip install 'deniable[grpc]'" in no_grpc.stderr, no_grpc.stderr
    async with running_services(tmp_path, [binary_campaign("bare-sdk")], https=HTTPS) as services:
        result = await _send(str(python), services, tmp_path, "--https")
        assert result == {"acknowledged": 1, "pending": 0, "loaded": []}
        answer = await counted(services, "bare-sdk", 1)
        assert answer.n == 1


def test_the_declared_dependencies_are_the_sdk_only() -> None:
    """The installed metadata: two runtime requirements; grpcio, cryptography and everything else
    behind an extra."""
    requires = distribution("deniable").requires or []
    bare = sorted(r.split(">")[0].split("=")[0].split("<")[0] for r in requires if "extra ==" not in r)
    assert bare == ["protobuf", "pynacl"]


def test_the_service_image_installs_the_server_extras() -> None:
    """The bare install cannot run a service: the container image must ask for the extras."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert 'pip install ".[server,postgres,mqtt]"' in dockerfile
