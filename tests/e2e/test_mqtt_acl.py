"""The shipped broker configuration (deploy/mosquitto.conf + mosquitto.acl) on a real mosquitto:
TLS only (the broker's certificate from the shuffler's CA), no anonymous clients, and only the
shuffler's user can publish campaign descriptions. The devices
behind it still verify every description's signature (tests/e2e/test_signed_campaigns.py shows
an open broker letting an anonymous client replace a retained campaign)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from support.stack import start_insecure_pair

from deniable.client import Outbox, Reporter
from deniable.client.mqtt import MqttTransport
from deniable.core.plumbing.certs import MQTT_BROKER, DevCerts, write_dev_certs
from deniable.core.plumbing.mqtt import DEFAULT_PREFIX, BrokerAddress, campaign_topic
from deniable.core.plumbing.service import insecure_channel
from deniable.shuffler.mqtt import MqttIngressConfig
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PASSWORDS = {"shuffler": "shuffler-secret", "device": "device-secret"}


def _shipped_config(port: int, passwords: Path, certs: DevCerts) -> str:
    """deploy/mosquitto.conf with only the port, the persistence and the file paths made local."""
    text = (DEPLOY / "mosquitto.conf").read_text()
    rules = [
        (r"(?m)^listener 8883 0\.0\.0\.0$", f"listener {port} 127.0.0.1"),
        (r"(?m)^certfile /mosquitto/certs/mqtt-broker\.pem$", f"certfile {certs.cert(MQTT_BROKER)}"),
        (r"(?m)^keyfile /mosquitto/certs/mqtt-broker\.key$", f"keyfile {certs.key(MQTT_BROKER)}"),
        (r"(?m)^persistence true$", "persistence false"),
        (r"(?m)^persistence_location .*\n", ""),
        (r"(?m)^password_file /mosquitto/config/passwords$", f"password_file {passwords}"),
        (r"(?m)^acl_file /mosquitto/config/mosquitto\.acl$", f"acl_file {DEPLOY / 'mosquitto.acl'}"),
    ]
    for pattern, replacement in rules:
        text, count = re.subn(pattern, replacement, text)
        assert count == 1, f"deploy/mosquitto.conf no longer has {pattern!r}"
    assert re.search(r"(?m)^allow_anonymous false$", text)
    assert len(re.findall(r"(?m)^listener ", text)) == 1  # the TLS listener only: no plaintext port
    if os.geteuid() == 0:  # mosquitto started as root drops to user "mosquitto", who cannot read tmp_path
        text += "user root\n"
    return text


@pytest.fixture
def broker_certs(tmp_path: Path) -> DevCerts:
    """The shuffler's CA and the broker's certificate from it, as `deniable certs dev --mqtt-host`."""
    return write_dev_certs(tmp_path / "certs", mqtt_hosts=["127.0.0.1", "localhost"])


@pytest.fixture
def trusting(broker_certs: DevCerts) -> ssl.SSLContext:
    """What devices and the shuffler verify the broker with: the shuffler's CA only."""
    return ssl.create_default_context(cafile=str(broker_certs.ca("shuffler")))


@pytest.fixture
def shipped_broker(
    own_mqtt_broker: Callable[[], Any], tmp_path: Path, broker_certs: DevCerts, trusting: ssl.SSLContext
) -> BrokerAddress:
    """A mosquitto running the shipped configuration, with users shuffler and device (TLS)."""
    tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    passwords = tmp_path / "passwords"
    for user, password in PASSWORDS.items():
        create = ["-c"] if not passwords.exists() else []
        subprocess.run([tool, *create, "-b", str(passwords), user, password], check=True, capture_output=True)
    passwords.chmod(0o600)
    broker = own_mqtt_broker()  # started with the test defaults: restart it with the shipped config
    broker.stop()
    broker.config.write_text(_shipped_config(broker.port, passwords, broker_certs))
    broker.start()
    address: BrokerAddress = broker.address
    return BrokerAddress(address.host, address.port, tls=trusting)


def _as(broker: BrokerAddress, user: str) -> BrokerAddress:
    return BrokerAddress(broker.host, broker.port, user, PASSWORDS[user], tls=broker.tls)


@contextlib.asynccontextmanager
async def _client(broker: BrokerAddress) -> AsyncIterator[aiomqtt.Client]:
    async with aiomqtt.Client(
        broker.host,
        broker.port,
        username=broker.username,
        password=broker.password,
        timeout=5,
        tls_context=broker.tls,
    ) as client:
        yield client


async def test_the_shipped_broker_speaks_tls_only(shipped_broker: BrokerAddress) -> None:
    """A plaintext client (the device password in clear) gets no session on the only listener."""
    plain = BrokerAddress(shipped_broker.host, shipped_broker.port, "device", PASSWORDS["device"])
    with pytest.raises(aiomqtt.MqttError):
        async with _client(plain):
            pass
    async with _client(_as(shipped_broker, "device")):
        pass  # the control: the same login over TLS


async def test_anonymous_clients_are_refused(shipped_broker: BrokerAddress) -> None:
    with pytest.raises(aiomqtt.MqttError):
        async with _client(shipped_broker):
            pass
    with pytest.raises(aiomqtt.MqttError):
        async with _client(BrokerAddress(shipped_broker.host, shipped_broker.port, "device", "wrong")):
            pass


async def test_only_the_shuffler_user_can_retain_a_campaign(shipped_broker: BrokerAddress) -> None:
    """A device's retained "campaign" is dropped by the ACL; the shuffler's is kept and delivered."""
    spoofed = campaign_topic(DEFAULT_PREFIX, "spoofed")
    genuine = campaign_topic(DEFAULT_PREFIX, "genuine")
    sentinel = campaign_topic(DEFAULT_PREFIX, "sentinel")
    async with _client(_as(shipped_broker, "device")) as device:
        await device.publish(spoofed, b"forged", qos=1, retain=True)
    async with _client(_as(shipped_broker, "shuffler")) as shuffler:
        await shuffler.publish(genuine, b"real", qos=1, retain=True)
        async with _client(_as(shipped_broker, "device")) as reader:
            await reader.subscribe(campaign_topic(DEFAULT_PREFIX, "+"), qos=1)
            await shuffler.publish(sentinel, b"end", qos=1)  # routed after the retained messages
            seen: dict[str, bytes] = {}
            async with asyncio.timeout(10):
                async for message in reader.messages:
                    assert isinstance(message.payload, bytes)
                    seen[message.topic.value] = message.payload
                    if message.topic.value == sentinel:
                        break
    assert seen == {genuine: b"real", sentinel: b"end"}


async def test_devices_behind_the_shipped_broker_get_verified_campaigns(
    shipped_broker: BrokerAddress, tmp_path: Path
) -> None:
    """The real shuffler logs in as its user and announces; a device logs in as a device, fetches
    and verifies; a device's attempt to overwrite the description changes nothing it receives."""
    ingress = MqttIngressConfig(broker=_as(shipped_broker, "shuffler"))
    aggregator, shuffler = await start_insecure_pair(tmp_path, mqtt=ingress)
    channel = insecure_channel(aggregator.address)
    device = MqttTransport(_as(shipped_broker, "device"), timeout_s=5.0, campaign_wait_s=2.0)
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        operator = pb_grpc.AggregatorStub(channel)
        request = pb.CreateCampaignRequest(id="lang", question="q", kind=pb.BINARY, epsilon0=1.0, n_min=2)
        created = await operator.CreateCampaign(request, timeout=30)
        pinned = (await operator.ListKeys(pb.ListKeysRequest(), timeout=30)).signing_public_key
        assert shuffler.mqtt is not None
        await asyncio.wait_for(shuffler.mqtt.connected.wait(), 30)
        await shuffler.mqtt.announce_now()
        spoof = pb.Campaign()
        spoof.CopyFrom(created)
        spoof.epsilon0 = 20.0
        async with _client(_as(shipped_broker, "device")) as attacker:
            await attacker.publish(
                campaign_topic(DEFAULT_PREFIX, "lang"), spoof.SerializeToString(), retain=True
            )
        reporter = await Reporter.fetch("lang", device, outbox, aggregator_key=pinned)
        assert reporter.campaign == created
        reporter.record(1)
        reporter.record(0)
        assert (await reporter.send_pending()).acknowledged == 2
    finally:
        outbox.close()
        await device.close()
        await channel.close()
        await shuffler.stop()
        await aggregator.stop()
