"""Docker and compose for the container tests (tests/deploy/test_images.py, test_compose_stack.py).

Those tests are marked ``containers`` and deselected by default; scripts/test-containers.sh builds
the images and runs them (ADR 0036). Images come from the environment the script sets:
``DENIABLE_IMAGE_TAG`` (default ``dev``) for deniable-{aggregator,shuffler,cli}, and
``DENIABLE_{POSTGRES,MOSQUITTO,PROMETHEUS}_IMAGE`` for the third-party services compose runs.
Commands run as root (CI does): dev-setup.sh gives files to the services' uids.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TAG = os.environ.get("DENIABLE_IMAGE_TAG", "dev")
LOCAL_SERVICES = {
    "DENIABLE_POSTGRES_IMAGE": "deniable-postgres:local",
    "DENIABLE_MOSQUITTO_IMAGE": "deniable-mosquitto:local",
    "DENIABLE_PROMETHEUS_IMAGE": "deniable-prometheus:local",
}
SERVICES = ("postgres", "aggregator", "mosquitto", "shuffler", "prometheus")
HEALTHCHECKED = ("postgres", "aggregator", "shuffler")


def image(name: str) -> str:
    """One of our images: deniable-<name>:<DENIABLE_IMAGE_TAG>."""
    return f"deniable-{name}:{TAG}"


def run(
    *argv: str, check: bool = True, timeout: float = 300.0, **kw: object
) -> subprocess.CompletedProcess[str]:
    """Run a command, text output captured; AssertionError with its stderr when ``check`` fails."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv[:4])}... exited {done.returncode}: {done.stderr[-2000:]}")
    return done  # type: ignore[no-any-return]


def docker(*argv: str, check: bool = True, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    """``docker ...``."""
    return run("docker", *argv, check=check, timeout=timeout)


def unavailable() -> str:
    """Why the container tests cannot run here (empty: they can)."""
    if os.geteuid() != 0:
        return "container tests run as root (scripts/test-containers.sh)"
    for tool in ("docker", "docker-compose"):
        if shutil.which(tool) is None:
            return f"{tool} is missing: run scripts/test-containers.sh"
    if docker("info", check=False, timeout=30).returncode != 0:
        return "no Docker engine answers: run scripts/test-containers.sh"
    missing = [i for i in (image("aggregator"), image("shuffler"), image("cli")) if not has_image(i)]
    return f"images not built: {missing} (scripts/test-containers.sh)" if missing else ""


def has_image(name: str) -> bool:
    """Whether the engine has this image."""
    return docker("image", "inspect", name, check=False, timeout=30).returncode == 0


def dev_setup(out: Path) -> Path:
    """deploy/dev-setup.sh's certificates and secrets under ``out`` (world-traversable)."""
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o755)
    env = {**os.environ, "DENIABLE": str(Path(sys.executable).with_name("deniable"))}
    run(str(DEPLOY / "dev-setup.sh"), str(out), env=env)
    return out


@dataclass
class Stack:
    """deploy/compose.yaml, copied with its configuration files into ``directory``, as project ``project``."""

    directory: Path
    project: str
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def prepare(cls, directory: Path, project: str) -> Stack:
        """Copy the compose file and its configuration, and make dev-setup.sh's files beside them."""
        for name in ("compose.yaml", "mosquitto.conf", "mosquitto.acl"):
            shutil.copy(DEPLOY / name, directory / name)
        shutil.copytree(DEPLOY / "prometheus", directory / "prometheus")
        dev_setup(directory)
        return cls(directory, project)

    def env(self) -> dict[str, str]:
        """The environment compose interpolates: the local stand-ins unless already set."""
        return {**LOCAL_SERVICES, **os.environ}

    def compose(
        self, *argv: str, check: bool = True, timeout: float = 300.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``docker-compose -p <project> -f <directory>/compose.yaml ...`` (``input``: its stdin)."""
        base = ("docker-compose", "--no-ansi", "-p", self.project, "-f", str(self.directory / "compose.yaml"))
        return run(*base, *argv, check=check, timeout=timeout, env=self.env(), input=input)

    def up(self, *services: str) -> float:
        """Start (no build: the script built the images); seconds until every healthcheck passes."""
        start = time.monotonic()
        self.compose("up", "-d", "--no-build", *services, timeout=600)
        self.wait_healthy(*(services or HEALTHCHECKED))
        return time.monotonic() - start

    def down(self) -> None:
        """Remove the containers, networks and volumes."""
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "10", check=False, timeout=300)

    def container(self, service: str) -> str:
        """The id of the service's (first) container."""
        ids = self.compose("ps", "-q", service).stdout.split()
        assert ids, f"{service} has no container"
        return ids[0]

    def state(self, service: str) -> dict[str, object]:
        """``docker inspect``'s State of the service's container."""
        state: dict[str, object] = json.loads(
            docker("inspect", "-f", "{{json .State}}", self.container(service)).stdout
        )
        return state

    def wait_healthy(self, *services: str, timeout: float = 180.0) -> None:
        """Until each service runs and, where it has a healthcheck, is healthy; else AssertionError."""
        deadline = time.monotonic() + timeout
        for service in services:
            while True:
                state = self.state(service)
                health = state.get("Health")
                ok = state.get("Running") and (health is None or health.get("Status") == "healthy")  # type: ignore[attr-defined]
                if ok:
                    break
                if time.monotonic() > deadline:
                    logs = self.compose("logs", "--tail", "30", service, check=False).stdout
                    raise AssertionError(f"{service} not healthy: {state}\n{logs}")
                time.sleep(0.5)

    def ip(self, service: str, network: str) -> str:
        """The service's address on one of the stack's networks."""
        template = f'{{{{(index .NetworkSettings.Networks "{self.project}_{network}").IPAddress}}}}'
        return docker("inspect", "-f", template, self.container(service)).stdout.strip()

    def operator(self, party: str = "aggregator") -> list[str]:
        """A party's operator TLS options (host side, the ports published on 127.0.0.1): each party
        has its own CA and operator credential (ADR 0030)."""
        certs = self.directory / "certs" / f"{party}-operator"
        return [f"--tls-ca={certs}/{party}-ca.pem", f"--tls-cert={certs}/{party}-operator.pem",
                f"--tls-key={certs}/{party}-operator.key"]  # fmt: skip

    def deniable(
        self, *argv: str, party: str = "aggregator", check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """This checkout's CLI on the host, as that party's operator."""
        return run(
            sys.executable, "-m", "deniable.cli", *argv, *self.operator(party), check=check, timeout=120
        )

    def create_campaign(self, campaign: str, batch_target: int = 50) -> str:
        """A binary campaign (n_min 2: the compose shuffler's own floor); the signing key (hex)."""
        self.deniable(
            "campaign", "create", "--aggregator=127.0.0.1:7700", "--id", campaign, "--question", "On?",
            "--kind", "binary", "--epsilon0", "1", "--n-min", "2", "--batch-target", str(batch_target),
            "--quota-per-source", "10000000",  # every simulated device comes from the host's one address
        )  # fmt: skip
        keys = json.loads(self.deniable("keys", "show", "--aggregator=127.0.0.1:7700", "--json").stdout)
        return str(keys["signing_public_key"])

    def counted(self, campaign: str) -> int:
        """Reports the aggregator counted for the campaign, after asking the shuffler to forward all
        it holds: a last report alone below n_min needs both parties' operators (ADR 0030)."""
        self.deniable("campaign", "release-below-n-min", campaign, "--aggregator=127.0.0.1:7700", check=False)
        flush = ("shuffler", "flush", "--shuffler=127.0.0.1:7702", "--below-n-min")
        self.deniable(*flush, party="shuffler", check=False)
        answer = self.deniable("query", "binary-sum", campaign, "--aggregator=127.0.0.1:7700", "--json")
        return int(json.loads(answer.stdout)["n"])


def device_transport(stack: Stack) -> Any:
    """A device's transport: the published device port, TLS verified with the dev CA."""
    from deniable.client.transport import GrpcTransport
    from deniable.core.plumbing.tls import ClientTls

    ca = stack.directory / "certs" / "devices" / "shuffler-ca.pem"  # what apps ship
    return GrpcTransport("127.0.0.1:7701", timeout_s=5.0, tls=ClientTls(ca=ca))


async def send_reports(
    stack: Stack, campaign: str, key: str, outbox: Path, reports: int, give_up_s: float
) -> int:
    """Record ``reports`` answers and send them through the published device port until every one is
    acknowledged (retrying through restarts) or ``give_up_s`` passes; the number acknowledged."""
    from deniable.client.outbox import Outbox
    from deniable.client.reporter import Reporter
    from deniable.client.transport import TransportError

    transport = device_transport(stack)
    deadline = time.monotonic() + give_up_s
    with Outbox(outbox) as box:
        reporter = await Reporter.fetch(
            campaign, transport, box, aggregator_key=key, give_up_after_s=give_up_s
        )
        reporter.record_many([i % 2 for i in range(reports)])
        acknowledged = 0
        while box.count(campaign) and time.monotonic() < deadline:
            try:
                result = await reporter.send_pending(batch_size=50, max_attempts=4, max_delay_s=1.0)
            except TransportError:
                await asyncio.sleep(0.5)
                continue
            acknowledged += result.acknowledged
            assert result.rejected == 0, result
        return acknowledged
