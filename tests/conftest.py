"""Fixtures every test directory may use: a real MQTT broker (Debian's mosquitto) on loopback.

mosquitto is installed by scripts/system-deps.sh; without it these fixtures fail with that hint
rather than skip. The broker itself: tests/mqtt_broker.py.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from deniable.core.certs import DEV_ROLES, DevCerts, write_dev_certs
from deniable.core.mqtt import BrokerAddress


def _load_mqtt_broker() -> ModuleType:
    """tests/mqtt_broker.py, loaded by path (importlib mode: ``tests`` is not importable)."""
    name = "deniable_tests_mqtt_broker"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "mqtt_broker.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


mqtt_broker_module = _load_mqtt_broker()


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
