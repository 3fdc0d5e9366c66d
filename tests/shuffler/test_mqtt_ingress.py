"""The shuffler's MQTT face against a real mosquitto: ingestion, answers, announcements, bad input."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import aiomqtt
import grpc
import pytest

from deniable.core.plumbing import mqtt
from deniable.core.plumbing.mqtt import BrokerAddress
from deniable.shuffler.mqtt import MqttIngressConfig
from deniable.shuffler.server import RunningShuffler
from deniable.v1 import deniable_pb2 as pb


async def started(start: Any, broker: BrokerAddress, prefix: str, **overrides: Any) -> RunningShuffler:
    """A shuffler with its MQTT face on ``broker``, connected and subscribed."""
    config = MqttIngressConfig(broker=broker, prefix=prefix, announce_interval_s=0.2, reconnect_base_s=0.05)
    shuffler: RunningShuffler = await start(mqtt=config, **overrides)
    assert shuffler.mqtt is not None
    await asyncio.wait_for(shuffler.mqtt.connected.wait(), 10)
    return shuffler


@pytest.fixture
async def device(mqtt_broker: BrokerAddress) -> AsyncIterator[aiomqtt.Client]:
    """A raw MQTT client, as a device (or an attacker) would hold one."""
    async with aiomqtt.Client(mqtt_broker.host, mqtt_broker.port) as client:
        yield client


async def exchange(
    client: aiomqtt.Client, prefix: str, payload: bytes, request_id: str | None = None
) -> bytes:
    """Publish one submit message and return the shuffler's answer (bytes)."""
    request_id = request_id or mqtt.new_request_id()
    await client.subscribe(mqtt.ack_topic(prefix, request_id), qos=1)
    await client.publish(mqtt.submit_topic(prefix, request_id), payload, qos=1)
    async with asyncio.timeout(10):
        async for message in client.messages:
            if message.topic.value == mqtt.ack_topic(prefix, request_id):
                assert isinstance(message.payload, bytes)
                return message.payload
    raise AssertionError("no answer")


async def test_reports_over_mqtt_are_spooled_and_acknowledged(
    upstream: Any, start: Any, kit: SimpleNamespace, mqtt_broker: BrokerAddress, mqtt_prefix: str, device: Any
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=1000))
    shuffler = await started(start, mqtt_broker, mqtt_prefix)
    reports = kit.make_reports(campaign, 25)
    bad = pb.EncryptedReport(campaign_id="c1", key_id=campaign.key_id, ciphertext=b"short")
    raw = await exchange(
        device, mqtt_prefix, pb.SubmitReportsRequest(reports=[*reports, bad]).SerializeToString()
    )
    ack = pb.SubmitAck.FromString(raw)
    assert ack.status_code == 0
    assert ack.response.accepted == 25
    assert [(r.index, r.reason) for r in ack.response.rejected] == [(25, pb.WRONG_CIPHERTEXT_LENGTH)]
    stats = await shuffler.handlers.stats()
    assert [(s.campaign_id, s.pending) for s in stats.campaigns] == [("c1", 25)]
    assert shuffler.mqtt is not None
    assert shuffler.mqtt.metrics.messages._value.get() == 1
    client = shuffler.mqtt._client
    assert client is not None  # TCP_NODELAY: its answers must not wait on delayed ACKs (≈ 40 ms)
    connection = client._client.socket()
    assert isinstance(connection, socket.socket)
    assert connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


async def test_mqtt_reports_are_forwarded_in_a_batch_like_grpc_ones(
    upstream: Any, start: Any, kit: SimpleNamespace, mqtt_broker: BrokerAddress, mqtt_prefix: str, device: Any
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=40, batch_target=40))
    await started(start, mqtt_broker, mqtt_prefix)
    reports = kit.make_reports(campaign, 40)
    for chunk in (reports[:15], reports[15:]):
        ack = pb.SubmitAck.FromString(
            await exchange(device, mqtt_prefix, pb.SubmitReportsRequest(reports=chunk).SerializeToString())
        )
        assert ack.response.accepted == len(chunk)
    await kit.eventually(lambda: len(upstream.fake.acked) == 1)
    assert sorted(upstream.fake.forwarded_ciphertexts()) == sorted(r.ciphertext for r in reports)


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"\xff\xff\xff not protobuf", grpc.StatusCode.INVALID_ARGUMENT),
        (b"", grpc.StatusCode.INVALID_ARGUMENT),  # an empty request
        (b"x" * 5000, grpc.StatusCode.RESOURCE_EXHAUSTED),  # over the configured limit
    ],
)
async def test_bad_requests_get_a_status_and_change_nothing(
    upstream: Any,
    start: Any,
    kit: SimpleNamespace,
    mqtt_broker: BrokerAddress,
    mqtt_prefix: str,
    device: Any,
    payload: bytes,
    code: grpc.StatusCode,
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=1000))
    config = MqttIngressConfig(broker=mqtt_broker, prefix=mqtt_prefix, max_message_bytes=4096)
    shuffler: RunningShuffler = await start(mqtt=config)
    assert shuffler.mqtt is not None
    await asyncio.wait_for(shuffler.mqtt.connected.wait(), 10)
    ack = pb.SubmitAck.FromString(await exchange(device, mqtt_prefix, payload))
    assert (ack.status_code, ack.HasField("response")) == (code.value[0], False)
    assert ack.status_message
    assert (await shuffler.handlers.stats()).campaigns == []
    failed = shuffler.metrics.requests_failed.labels(rpc="MqttSubmit", code=code.name)._value.get()
    assert failed == 1
    # and the face still works afterwards
    good = pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 3)).SerializeToString()
    assert pb.SubmitAck.FromString(await exchange(device, mqtt_prefix, good)).response.accepted == 3


async def test_a_malformed_submit_topic_is_dropped_and_counted(
    upstream: Any, start: Any, kit: SimpleNamespace, mqtt_broker: BrokerAddress, mqtt_prefix: str, device: Any
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=1000))
    shuffler = await started(start, mqtt_broker, mqtt_prefix)
    body = pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 2)).SerializeToString()
    await device.publish(f"{mqtt_prefix}/submit/NOT-AN-ID", body, qos=1)
    assert shuffler.mqtt is not None
    metrics = shuffler.mqtt.metrics
    await kit.eventually(lambda: metrics.dropped.labels(reason="bad_topic")._value.get() == 1)
    assert (await shuffler.handlers.stats()).campaigns == []


async def test_campaigns_are_retained_on_the_broker_and_updated(
    upstream: Any, start: Any, kit: SimpleNamespace, mqtt_broker: BrokerAddress, mqtt_prefix: str, device: Any
) -> None:
    upstream.fake.add(kit.make_campaign("c1"))
    shuffler = await started(start, mqtt_broker, mqtt_prefix)
    assert shuffler.mqtt is not None
    await kit.eventually(
        lambda: shuffler.mqtt is not None and shuffler.mqtt.metrics.announcements._value.get() >= 1
    )

    async def retained(campaign_id: str) -> pb.Campaign:
        async with aiomqtt.Client(mqtt_broker.host, mqtt_broker.port) as late_device:  # subscribes afterwards
            await late_device.subscribe(mqtt.campaign_topic(mqtt_prefix, campaign_id), qos=1)
            async with asyncio.timeout(5):
                async for message in late_device.messages:
                    assert message.retain
                    assert isinstance(message.payload, bytes)
                    return pb.Campaign.FromString(message.payload)
        raise AssertionError("nothing retained")

    assert (await retained("c1")).key_id == 7
    upstream.fake.add(kit.make_campaign("c1", key_id=8))  # a key rotation
    upstream.fake.add(kit.make_campaign("c2"))
    await kit.eventually(
        lambda: shuffler.mqtt is not None and shuffler.mqtt.metrics.announcements._value.get() >= 3
    )
    assert (await retained("c1")).key_id == 8
    assert (await retained("c2")).id == "c2"
    assert await shuffler.mqtt.announce_now() == 0  # nothing changed: nothing republished


async def test_the_face_reconnects_after_the_broker_restarts(
    upstream: Any, start: Any, kit: SimpleNamespace, own_mqtt_broker: Any
) -> None:
    broker = own_mqtt_broker()
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=1000))
    shuffler = await started(start, broker.address, mqtt.DEFAULT_PREFIX)
    assert shuffler.mqtt is not None
    broker.stop()
    await kit.eventually(
        lambda: shuffler.mqtt is not None and not shuffler.mqtt.connected.is_set(), timeout=10
    )
    broker.start()
    await asyncio.wait_for(shuffler.mqtt.connected.wait(), 15)
    assert shuffler.mqtt.metrics.connects._value.get() == 2
    async with aiomqtt.Client(broker.address.host, broker.address.port) as device:
        body = pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 4)).SerializeToString()
        ack = pb.SubmitAck.FromString(await exchange(device, mqtt.DEFAULT_PREFIX, body))
        assert ack.response.accepted == 4
        # the campaign is announced again: the restarted broker had lost its retained messages
        await device.subscribe(mqtt.campaign_topic(mqtt.DEFAULT_PREFIX, "c1"), qos=1)
        async with asyncio.timeout(5):
            async for message in device.messages:
                assert isinstance(message.payload, bytes)
                assert pb.Campaign.FromString(message.payload).id == "c1"
                break


async def test_a_shuffler_whose_broker_is_down_still_serves_grpc(
    upstream: Any, start: Any, kit: SimpleNamespace, channel_to: Any
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=1000))
    nowhere = BrokerAddress("127.0.0.1", 1)  # nothing listens on port 1
    shuffler: RunningShuffler = await start(mqtt=MqttIngressConfig(broker=nowhere, reconnect_base_s=0.05))
    stub = channel_to(shuffler)
    response = await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 2)))
    assert response.accepted == 2
    assert shuffler.mqtt is not None and not shuffler.mqtt.connected.is_set()


async def test_replicas_with_a_shared_subscription_split_requests_and_answer_each_once(
    upstream: Any,
    start: Any,
    kit: SimpleNamespace,
    mqtt_broker: BrokerAddress,
    mqtt_prefix: str,
    device: Any,
    tmp_path: Any,
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=1000))
    config = MqttIngressConfig(broker=mqtt_broker, prefix=mqtt_prefix, shared_subscription=True)
    replicas: list[RunningShuffler] = [
        await start(mqtt=config, data_dir=tmp_path / f"replica{i}") for i in (0, 1)
    ]
    for replica in replicas:
        assert replica.mqtt is not None
        await asyncio.wait_for(replica.mqtt.connected.wait(), 10)
    request_ids = [mqtt.new_request_id() for _ in range(20)]
    answers: dict[str, int] = {}
    for request_id in request_ids:
        await device.subscribe(mqtt.ack_topic(mqtt_prefix, request_id), qos=1)
    for request_id in request_ids:
        body = pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 3)).SerializeToString()
        await device.publish(mqtt.submit_topic(mqtt_prefix, request_id), body, qos=1)
    async with asyncio.timeout(10):
        async for message in device.messages:
            request_id = message.topic.value.rsplit("/", 1)[1]
            answers[request_id] = answers.get(request_id, 0) + 1
            if len(answers) == len(request_ids):
                break
    assert answers == {request_id: 1 for request_id in request_ids}
    spooled = [sum(s.pending for s in (await r.handlers.stats()).campaigns) for r in replicas]
    assert sum(spooled) == 60
    handled = [r.mqtt.metrics.messages._value.get() for r in replicas if r.mqtt is not None]
    assert sum(handled) == 20 and min(handled) > 0  # both replicas took part
