"""Fixtures every test directory may use: a real MQTT broker (Debian's mosquitto) on loopback.

mosquitto is installed by scripts/system-deps.sh; without it these fixtures fail with that hint
rather than skip. The broker itself: tests/support/mqtt_broker.py.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import mqtt_broker as mqtt_broker_module
from support.processes import free_port, wait_listening

from deniable.core.plumbing.certs import DEV_ROLES, DevCerts, write_dev_certs
from deniable.core.plumbing.mqtt import BrokerAddress


def _mosquitto(directory: Path) -> Any:
    """A stopped broker in ``directory``; the test fails in one line if mosquitto is missing."""
    try:
        return mqtt_broker_module.Mosquitto(directory)
    except mqtt_broker_module.MosquittoUnavailable as exc:
        problem = str(exc)
    pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def mqtt_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerAddress]:
    """One broker for the whole session; tests keep apart by topic prefix."""
    broker = _mosquitto(tmp_path_factory.mktemp("mosquitto"))
    broker.start()
    yield broker.address
    broker.stop()


@pytest.fixture
def own_mqtt_broker(tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Start a broker of the test's own (to stop and restart it); stopped afterwards."""
    started: list[Any] = []

    def start() -> Any:
        broker = _mosquitto(tmp_path / f"mosquitto-{len(started)}")
        broker.start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def mqtt_prefix(request: pytest.FixtureRequest) -> str:
    """A topic prefix of this test's own, so tests sharing the broker never see each other."""
    return f"test/{abs(hash(request.node.nodeid)):x}/deniable/v1"


@pytest.fixture(scope="session")
def dev_certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    """One development CA for the session and a certificate per role (device included)."""
    return write_dev_certs(tmp_path_factory.mktemp("certs"), roles=(*DEV_ROLES, "device"))


@pytest.fixture(scope="session")
def other_ca_certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    """Certificates with the same roles from an unrelated CA (a stranger's)."""
    return write_dev_certs(tmp_path_factory.mktemp("other-certs"), roles=(*DEV_ROLES, "device"))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """One PostgreSQL server for the session (started on first use); fails if it cannot start.

    The helper module (and asyncpg) is loaded here, not at import: the SDK's lowest-versions run
    (scripts/lowest.sh) has no asyncpg."""
    from support import postgres_server as postgres_server_module  # asyncpg: only when asked for

    try:
        server = postgres_server_module.PostgresServer.start()
    except postgres_server_module.PostgresUnavailable as exc:
        problem = str(exc)
    else:
        yield server
        server.stop()
        return
    pytest.fail(problem, pytrace=False)  # outside the except: one line, no chained traceback


@pytest.fixture
async def postgres_dsn(postgres_server: Any) -> AsyncIterator[str]:
    """DSN of a fresh, empty database on the session's server (dropped afterwards)."""
    name = await postgres_server.create_database()
    yield postgres_server.dsn(name)
    await postgres_server.drop_database(name)


@pytest.fixture
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway ``nats-server -js`` on a free loopback port (JetStream in a temp dir, 64 MiB
    messages so a whole batch fits); nats-server comes from scripts/system-deps.sh."""
    binary = shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None
    )
    if binary is None:
        pytest.fail("nats-server not found: run scripts/system-deps.sh", pytrace=False)
    root = tmp_path_factory.mktemp("nats")
    port = free_port()
    conf = root / "nats.conf"
    conf.write_text(
        f'listen: "127.0.0.1:{port}"\nmax_payload: 67108864\nmax_pending: 134217728\n'
        f'jetstream {{ store_dir: "{root / "js"}" }}\n'
    )
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        try:
            wait_listening(port, proc)
        except AssertionError as exc:
            pytest.fail(f"nats-server did not start: {exc}", pytrace=False)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
