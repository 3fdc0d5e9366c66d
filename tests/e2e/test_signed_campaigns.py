"""Signed campaign descriptions, key rotation and the hybrid KEM through the real services on loopback.

Each attack is shown succeeding against a device that skips verification (``insecure_skip_verify``)
and refused by a device that pins the aggregator's signing key: the protection is what stops it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import grpc
import pytest
from support.stack import start_insecure_pair

from deniable.aggregator import RunningAggregator
from deniable.client import (
    CampaignClosed,
    CampaignPolicyError,
    CampaignSignatureError,
    DevicePolicy,
    GrpcTransport,
    Outbox,
    Reporter,
)
from deniable.client.mqtt import MqttTransport
from deniable.core.crypto import HYBRID_SUITE_NAME, KeyPair, SigningKey, open_report, verify_campaign
from deniable.core.plumbing import mqtt
from deniable.core.plumbing.mqtt import BrokerAddress
from deniable.core.plumbing.service import insecure_channel
from deniable.core.wire import decode
from deniable.shuffler import RunningShuffler, ShufflerConfig, start_shuffler
from deniable.shuffler.mqtt import MqttIngressConfig
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

Tamper = Callable[[pb.Campaign], None]


@dataclass
class Stack:
    aggregator: RunningAggregator
    shuffler: RunningShuffler
    operator: pb_grpc.AggregatorAsyncStub
    pinned: bytes  # the signing public key an app would ship

    async def create(self, campaign_id: str, kem: str = "", n_min: int = 5) -> pb.Campaign:
        request = pb.CreateCampaignRequest(
            id=campaign_id, question="q?", kind=pb.CATEGORICAL, labels=["a", "b", "c"], epsilon0=1.0
        )
        request.n_min, request.kem = n_min, kem
        created: pb.Campaign = await self.operator.CreateCampaign(request, timeout=30)
        return created

    async def count(self, campaign_id: str, expected: int) -> pb.QueryResponse:
        """Flush the shuffler and query until ``expected`` reports are counted (or 30 s passed)."""
        await self.shuffler.flush(campaign_id)
        for _ in range(300):
            answer: pb.QueryResponse = await self.operator.Histogram(
                pb.QueryRequest(campaign_id=campaign_id), timeout=30
            )
            if answer.n + answer.rejected >= expected:
                break
            await asyncio.sleep(0.1)
        return answer


async def _stack(tmp_path: Path, mqtt_config: MqttIngressConfig | None = None) -> Stack:
    aggregator, shuffler = await start_insecure_pair(tmp_path, mqtt=mqtt_config)
    operator = pb_grpc.AggregatorStub(insecure_channel(aggregator.address))
    keys = await operator.ListKeys(pb.ListKeysRequest(), timeout=30)
    return Stack(aggregator, shuffler, operator, keys.signing_public_key)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    running = await _stack(tmp_path)
    try:
        yield running
    finally:
        await running.shuffler.stop()
        await running.aggregator.stop()


class TamperingProxy(pb_grpc.ShufflerServicer):
    """A malicious shuffler in front of the real one: relays everything, rewrites GetCampaign."""

    def __init__(self, upstream: pb_grpc.ShufflerAsyncStub, tamper: Tamper) -> None:
        self.upstream = upstream
        self.tamper = tamper

    async def GetCampaign(
        self, request: pb.GetCampaignRequest, context: grpc.aio.ServicerContext[object, pb.Campaign]
    ) -> pb.Campaign:
        campaign: pb.Campaign = await self.upstream.GetCampaign(request, timeout=10)
        self.tamper(campaign)
        return campaign

    async def SubmitReports(
        self,
        request: pb.SubmitReportsRequest,
        context: grpc.aio.ServicerContext[object, pb.SubmitReportsResponse],
    ) -> pb.SubmitReportsResponse:
        response: pb.SubmitReportsResponse = await self.upstream.SubmitReports(request, timeout=10)
        return response


ATTACKER = KeyPair.generate(1)  # the key id stays the campaign's: only the key bytes change


def _swap_key(campaign: pb.Campaign) -> None:
    campaign.public_key = ATTACKER.public.raw


def _raise_epsilon0(campaign: pb.Campaign) -> None:
    campaign.epsilon0 = 20.0
    campaign.device_budget_epsilon = 20.0


def _re_sign_with_own_key(campaign: pb.Campaign) -> None:
    _swap_key(campaign)
    campaign.CopyFrom(SigningKey.generate().sign_campaign(campaign))


def _strip_signature(campaign: pb.Campaign) -> None:
    _swap_key(campaign)
    campaign.ClearField("signature")


@pytest.mark.parametrize(
    "tamper",
    [_swap_key, _raise_epsilon0, _re_sign_with_own_key, _strip_signature],
    ids=["public-key", "epsilon0", "re-signed-by-attacker", "unsigned"],
)
async def test_a_shuffler_rewriting_the_description_is_refused(
    stack: Stack, tmp_path: Path, tamper: Tamper
) -> None:
    """Through a tampering proxy: a device that skips verification takes the forged description
    (the attack works: with a swapped key the proxy opens its reports); a pinned device refuses."""
    campaign = await stack.create("lang")
    upstream = insecure_channel(stack.shuffler.address)
    server = grpc.aio.server()
    proxy = TamperingProxy(pb_grpc.ShufflerStub(upstream), tamper)  # type: ignore[abstract]  # device methods only
    pb_grpc.add_ShufflerServicer_to_server(proxy, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    transport = GrpcTransport(f"127.0.0.1:{port}", timeout_s=10, insecure=True)
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        gullible = await Reporter.fetch("lang", transport, outbox, insecure_skip_verify=True)
        assert gullible.campaign != campaign  # the forgery reached the device
        if gullible.campaign.public_key == ATTACKER.public.raw:
            gullible.record(2)
            (sealed,) = outbox.pending(10, "lang")
            opened = open_report(sealed.ciphertext, ATTACKER, "lang", gullible.campaign.incarnation)
            plain = decode(opened, campaign.plaintext_length)
            assert plain.campaign_id == "lang"  # the proxy reads the report
        with pytest.raises(CampaignSignatureError):
            await Reporter.fetch("lang", transport, outbox, aggregator_key=stack.pinned)
        with pytest.raises(CampaignSignatureError):  # hex, as an app's config would hold it
            await Reporter.fetch("lang", transport, outbox, aggregator_key=stack.pinned.hex())
    finally:
        outbox.close()
        await transport.close()
        await server.stop(None)
        await upstream.close()


async def test_untampered_description_verifies_and_policy_refuses_weaker_campaigns(
    stack: Stack, tmp_path: Path
) -> None:
    """Through the real shuffler the signed description verifies; without a pinned key the SDK
    refuses unless told to skip by name; a signed campaign weaker than the policy is a policy error."""
    await stack.create("lang", n_min=5)
    transport = GrpcTransport(stack.shuffler.address, timeout_s=10, insecure=True)
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        reporter = await Reporter.fetch("lang", transport, outbox, aggregator_key=stack.pinned)
        assert reporter.campaign.epsilon0 == 1.0
        with pytest.raises(CampaignSignatureError, match="pinned"):
            await Reporter.fetch("lang", transport, outbox)
        for policy in (
            DevicePolicy(max_epsilon0=0.5),
            DevicePolicy(min_batch=1000),
            DevicePolicy.of(allowed_mechanisms=["binary_rr"]),
        ):
            with pytest.raises(CampaignPolicyError):
                await Reporter.fetch("lang", transport, outbox, aggregator_key=stack.pinned, policy=policy)
        accepting = DevicePolicy.of(max_epsilon0=1.0, allowed_mechanisms=["grr"], min_batch=5)
        await Reporter.fetch("lang", transport, outbox, aggregator_key=stack.pinned, policy=accepting)
    finally:
        outbox.close()
        await transport.close()


async def test_spoofed_retained_mqtt_campaign_is_refused(
    tmp_path: Path, mqtt_broker: BrokerAddress, mqtt_prefix: str
) -> None:
    """On an open broker anyone can replace the retained campaign (another key, ε0 raised): the
    skipping device takes it; the pinned device refuses it (and accepts the shuffler's original)."""
    running = await _stack(tmp_path, MqttIngressConfig(broker=mqtt_broker, prefix=mqtt_prefix))
    device = MqttTransport(mqtt_broker, prefix=mqtt_prefix, timeout_s=5.0, campaign_wait_s=2.0, insecure=True)
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        await running.create("lang")
        assert running.shuffler.mqtt is not None
        await asyncio.wait_for(running.shuffler.mqtt.connected.wait(), 30)
        await running.shuffler.mqtt.announce_now()
        genuine = await Reporter.fetch("lang", device, outbox, aggregator_key=running.pinned)
        topic = mqtt.campaign_topic(mqtt_prefix, "lang")
        for tamper in (_swap_key, _raise_epsilon0, _re_sign_with_own_key):
            spoof = pb.Campaign()
            spoof.CopyFrom(genuine.campaign)
            tamper(spoof)
            async with aiomqtt.Client(mqtt_broker.host, mqtt_broker.port) as attacker:  # anonymous
                await attacker.publish(topic, spoof.SerializeToString(), qos=1, retain=True)
            gullible = await Reporter.fetch("lang", device, outbox, insecure_skip_verify=True)
            assert gullible.campaign == spoof  # the broker now serves the forgery
            with pytest.raises(CampaignSignatureError):
                await Reporter.fetch("lang", device, outbox, aggregator_key=running.pinned)
    finally:
        outbox.close()
        await device.close()
        await running.shuffler.stop()
        await running.aggregator.stop()


async def test_rotation_counts_every_report_sealed_to_the_old_key_then_destroys_it(
    stack: Stack, tmp_path: Path
) -> None:
    """Reports sealed to key 1 before and after rotating to key 2 are all counted; key 1 cannot be
    destroyed while its campaign is open; after drain and close its file is gone."""
    old = await stack.create("old")
    assert old.key_id == 1
    transport = GrpcTransport(stack.shuffler.address, timeout_s=10, insecure=True)
    outbox = Outbox(tmp_path / "outbox.db")
    key_file = tmp_path / "agg" / "keys" / "1.key"
    try:
        device = await Reporter.fetch("old", transport, outbox, aggregator_key=stack.pinned)
        device.record_many([0, 1, 2] * 10)
        assert (await device.send_pending()).acknowledged == 30
        rotated: pb.KeyInfo = await stack.operator.RotateKey(pb.KeyRotateRequest(), timeout=30)
        assert (rotated.key_id, rotated.state) == (2, "active")
        assert (await stack.create("new")).key_id == 2
        again = await Reporter.fetch("old", transport, outbox, aggregator_key=stack.pinned)
        assert again.campaign.key_id == 1  # a campaign keeps the key it was created with
        device.record_many([2, 1] * 10)  # sealed to key 1 after the rotation
        assert (await device.send_pending()).acknowledged == 20
        with pytest.raises(grpc.RpcError) as refused:
            await stack.operator.DestroyKey(pb.KeyDestroyRequest(key_id=1), timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        answer = await stack.count("old", 50)  # drained: everything the shuffler held is counted
        assert (answer.n, answer.rejected) == (50, 0)
        assert key_file.exists()

        closed: pb.Campaign = await stack.operator.CloseCampaign(
            pb.KeyCloseCampaignRequest(campaign_id="old"), timeout=30
        )
        assert closed.window_end_unix > 0 and closed.signature != old.signature  # re-signed
        verify_campaign(closed, stack.pinned)  # the shuffler relays it once its cache refreshes
        with pytest.raises(CampaignClosed):
            Reporter(closed, outbox, transport).record(0)
        destroyed = await stack.operator.DestroyKey(pb.KeyDestroyRequest(key_id=1), timeout=30)
        assert destroyed.state == "destroyed"
        assert not key_file.exists()
        keys = await stack.operator.ListKeys(pb.ListKeysRequest(), timeout=30)
        assert [(k.key_id, k.state) for k in keys.keys] == [(1, "destroyed"), (2, "active")]
        assert (await stack.count("old", 50)).n == 50  # counts survive the key
    finally:
        outbox.close()
        await transport.close()


async def test_hybrid_kem_campaign_runs_end_to_end(stack: Stack, tmp_path: Path) -> None:
    """A campaign on ML-KEM-768 + X25519: devices seal 1136-byte-overhead reports through the real
    shuffler and the aggregator counts every one."""
    campaign = await stack.create("pq", kem="x25519-mlkem768")
    assert campaign.hpke_suite == HYBRID_SUITE_NAME and len(campaign.public_key) == 1216
    assert campaign.ciphertext_length == campaign.plaintext_length + 1136
    transport = GrpcTransport(stack.shuffler.address, timeout_s=10, insecure=True)
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        device = await Reporter.fetch("pq", transport, outbox, aggregator_key=stack.pinned)
        device.record_many([0, 1, 2, 2] * 25)
        assert (await device.send_pending()).acknowledged == 100
    finally:
        outbox.close()
        await transport.close()
    answer = await stack.count("pq", 100)
    assert (answer.n, answer.rejected) == (100, 0)
    assert sum(b.raw_count for b in answer.buckets) == 100


async def test_a_description_from_the_shufflers_durable_cache_still_verifies(tmp_path: Path) -> None:
    """The shuffler serves its cached copy (aggregator down, shuffler restarted): the cached bytes
    are the signed ones, so a pinned device accepts them and a tampered cache is refused."""
    running = await _stack(tmp_path)
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        created = await running.create("lang")
        other = await running.create("other")
        transport = GrpcTransport(running.shuffler.address, timeout_s=10, insecure=True)
        for campaign_id in ("lang", "other"):  # cached now
            await Reporter.fetch(campaign_id, transport, outbox, aggregator_key=running.pinned)
        await transport.close()
        await running.aggregator.stop()
        tampered = pb.Campaign()
        tampered.CopyFrom(other)
        _raise_epsilon0(tampered)
        running.shuffler._store.cache_campaign(tampered)  # whoever can write the shuffler's disk
        await running.shuffler.stop()
        shuffler = await start_shuffler(
            ShufflerConfig(
                insecure=True,
                data_dir=tmp_path / "shuf",
                upstream=running.aggregator.address,
                listen="127.0.0.1:0",
            )
        )
        transport = GrpcTransport(shuffler.address, timeout_s=10, insecure=True)
        try:
            cached = await Reporter.fetch("lang", transport, outbox, aggregator_key=running.pinned)
            assert cached.campaign == created
            gullible = await Reporter.fetch("other", transport, outbox, insecure_skip_verify=True)
            assert gullible.campaign.epsilon0 == 20.0  # the cache served the tampered copy
            with pytest.raises(CampaignSignatureError):
                await Reporter.fetch("other", transport, outbox, aggregator_key=running.pinned)
        finally:
            await transport.close()
            await shuffler.stop()
    finally:
        outbox.close()
        await running.shuffler.stop()
        await running.aggregator.stop()
