"""The tests' throwaway PostgreSQL and mosquitto for the bench scripts (``tests/support``, from
scripts/system-deps.sh), or the server the user names instead.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deniable.core.plumbing.mqtt import BrokerAddress

TESTS = Path(__file__).resolve().parents[1] / "tests"


def _support_on_path() -> None:
    """Make ``support`` (tests/support) importable, as pytest's ``pythonpath = ["tests"]`` does."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))


@contextmanager
def postgres(dsn: str | None) -> Iterator[str]:
    """``dsn`` itself, or the superuser DSN of a durable throwaway server, stopped afterwards."""
    if dsn is not None:
        yield dsn
        return
    _support_on_path()
    from support.postgres_server import PostgresServer

    server = PostgresServer.start(durable=True)
    try:
        yield server.dsn()
    finally:
        server.stop()


@contextmanager
def mqtt_broker(address: str | None) -> Iterator[BrokerAddress]:
    """The broker at ``address`` (HOST:PORT), or a throwaway mosquitto on a free loopback port."""
    if address is not None:
        yield BrokerAddress.parse(address)
        return
    _support_on_path()
    from support.mqtt_broker import Mosquitto

    with tempfile.TemporaryDirectory(prefix="deniable-mqtt-bench-") as tmp:
        mosquitto = Mosquitto(Path(tmp) / "mosquitto")
        mosquitto.start()
        try:
            yield mosquitto.address
        finally:
            mosquitto.stop()
