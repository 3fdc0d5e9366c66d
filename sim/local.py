"""Simulated devices through real services in this process: the demo's engine, usable from a notebook.

``local_services`` starts an aggregator and a shuffler on free loopback ports in a directory you
give, with TLS on every link from throwaway per-party development CAs (devices trust only the
shuffler's CA; the shuffler trusts only the aggregator's; the shuffler and the aggregator's
operator authenticate to the aggregator with client certificates, each from its own party's CA). Through it:
create a campaign as the operator, have simulated devices report through the real client SDK
(randomise -> encode -> seal -> outbox -> gRPC), close the campaign and read the answer::

    async with local_services(workdir) as services:
        await services.create_campaign(request)
        await services.report(request.id, values)
        answer = await services.close_and_count(request.id)

``simulate`` does those steps for one campaign in a fresh temporary directory. See
docs/simulation.md.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from deniable.aggregator import AggregatorConfig, RunningAggregator, start_aggregator
from deniable.client import GrpcTransport, Outbox, Reporter, Transport
from deniable.core.plumbing.certs import DevCerts, write_dev_certs
from deniable.core.plumbing.tls import ServerTls, open_channel
from deniable.shuffler import RunningShuffler, ShufflerConfig, start_shuffler
from deniable.shuffler.mqtt import MqttIngressConfig
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc


def counting_budget_s(messages: int) -> float:
    """Time allowed for the aggregator to count ``messages``: a minute plus 1 ms a message,
    several times what decryption takes on a loaded 2-core machine (replaces a fixed 120 s)."""
    return 60.0 + messages / 1000


@dataclass
class Reported:
    """What one campaign's simulated devices did: messages acknowledged and seconds per step."""

    acknowledged: int
    randomise_seal_s: float
    send_s: float
    signing_key: bytes
    """The aggregator signing key the devices pinned and verified the campaign against."""


@dataclass
class LocalServices:
    """A running aggregator and shuffler on loopback, and an operator's channel to the aggregator."""

    workdir: Path
    certs: DevCerts
    aggregator: RunningAggregator
    shuffler: RunningShuffler
    operator: pb_grpc.AggregatorAsyncStub
    tls: bool = True
    """False: every link in plaintext (to measure what TLS costs; never a deployment)."""
    acknowledged: dict[str, int] = field(default_factory=dict)
    """Messages acknowledged per campaign so far (what ``close_and_count`` waits for)."""

    async def create_campaign(self, request: pb.CreateCampaignRequest) -> pb.Campaign:
        """CreateCampaign as the operator (planning a target ε takes a few seconds)."""
        created: pb.Campaign = await self.operator.CreateCampaign(request, timeout=300)
        return created

    async def signing_key(self) -> bytes:
        """The aggregator's campaign-signing key (an app ships it pinned; here it is read)."""
        keys = await self.operator.ListKeys(pb.ListKeysRequest(), timeout=30)
        return bytes(keys.signing_public_key)

    def device_transport(self) -> Transport:
        """A device's gRPC transport to the shuffler, verifying it against the throwaway CA."""
        if not self.tls:
            return GrpcTransport(self.shuffler.address, insecure=True)
        return GrpcTransport(self.shuffler.address, tls=self.certs.client_tls("shuffler"))

    def device_channel(self) -> grpc.aio.Channel:
        """A raw gRPC channel to the shuffler as a device opens it (for drivers below the SDK)."""
        if not self.tls:
            return open_channel(self.shuffler.address, insecure=True)
        return open_channel(self.shuffler.address, self.certs.client_tls("shuffler"))

    async def report(
        self,
        campaign_id: str,
        values: Sequence[int],
        transport: Transport | None = None,
        outbox: Outbox | None = None,
        progress: bool = False,
    ) -> Reported:
        """One simulated device per value reports it through the client SDK (RuntimeError if any is unsent).

        Without ``transport``/``outbox`` a gRPC transport and an outbox in the work directory are
        opened for this call and closed after it.
        """
        own_transport, own_outbox = transport is None, outbox is None
        transport = transport or self.device_transport()
        outbox = outbox or Outbox(self.workdir / "devices" / f"{campaign_id}.db")
        try:
            reported = await _devices_report(
                campaign_id, values, transport, outbox, await self.signing_key(), progress
            )
        finally:
            if own_outbox:
                outbox.close()
            if own_transport:
                await transport.close()
        self.acknowledged[campaign_id] = self.acknowledged.get(campaign_id, 0) + reported.acknowledged
        return reported

    async def close(self, campaign_id: str) -> None:
        """The window closes: the campaign is closed and the shuffler releases what it holds."""
        await self.operator.CloseCampaign(pb.KeyCloseCampaignRequest(campaign_id=campaign_id), timeout=30)
        await self.shuffler.flush(campaign_id)

    async def wait_counted(self, campaign_id: str, progress: bool = False) -> pb.QueryResponse:
        """The answer once every acknowledged message is counted (or ``counting_budget_s`` passed)."""
        campaign = await self.operator.GetCampaign(pb.GetCampaignRequest(campaign_id=campaign_id), timeout=30)
        rpc = self.operator.BinarySum if campaign.kind == pb.BINARY else self.operator.Histogram
        expected = self.acknowledged.get(campaign_id, 0)
        started = told = time.monotonic()
        deadline = started + counting_budget_s(expected)
        while True:
            answer: pb.QueryResponse = await rpc(pb.QueryRequest(campaign_id=campaign_id), timeout=30)
            # Acknowledgements count messages; multi-message mechanisms send several per device.
            done = answer.messages + answer.rejected
            if done >= expected or time.monotonic() > deadline:
                return answer
            if progress and time.monotonic() - told >= 5:
                told = time.monotonic()
                print(
                    f"counting {campaign_id}: {done}/{expected} messages counted,"
                    f" {answer.privacy.incomplete_releases} release(s) arriving, {told - started:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            await asyncio.sleep(0.1)

    async def close_and_count(self, campaign_id: str, progress: bool = False) -> pb.QueryResponse:
        """``close`` then ``wait_counted``: the campaign's final answer."""
        await self.close(campaign_id)
        return await self.wait_counted(campaign_id, progress)


async def _devices_report(
    campaign_id: str,
    values: Sequence[int],
    transport: Transport,
    outbox: Outbox,
    signing_key: bytes,
    progress: bool,
) -> Reported:
    """Fetch and verify the campaign, randomise and seal every value, send until all are answered."""
    started = time.perf_counter()
    reporter = await Reporter.fetch(campaign_id, transport, outbox, aggregator_key=signing_key)
    reporter.record_many(list(values), progress=progress)
    sealed_at = time.perf_counter()
    result = await reporter.send_pending(progress=progress)
    if result.pending or result.rejected:
        raise RuntimeError(
            f"{campaign_id}: {result.pending} reports still pending,"
            f" {result.rejected} rejected ({result.rejections})"
        )
    return Reported(result.acknowledged, sealed_at - started, time.perf_counter() - sealed_at, signing_key)


@asynccontextmanager
async def local_services(
    workdir: Path, mqtt: MqttIngressConfig | None = None, tls: bool = True, **shuffler_settings: Any
) -> AsyncIterator[LocalServices]:
    """An aggregator and a shuffler in this process on loopback, TLS from a throwaway CA in ``workdir``.

    With ``mqtt`` the shuffler also serves that broker; ``shuffler_settings`` override its
    ``ShufflerConfig``; ``tls=False`` runs every link in plaintext. Both stop when the block ends.
    """
    certs = write_dev_certs(workdir / "certs")  # throwaway: a CA per party, a certificate per role
    aggregator = await start_aggregator(
        AggregatorConfig(
            data_dir=workdir / "aggregator",
            listen="127.0.0.1:0",
            tls=_server_tls(certs, "aggregator", tls),
            insecure=not tls,
        )
    )
    try:
        settings = (
            _shuffler_settings(workdir, aggregator.address, certs, tls) | {"mqtt": mqtt} | shuffler_settings
        )
        shuffler = await start_shuffler(ShufflerConfig(**settings))
        try:
            operator_tls = certs.client_tls("aggregator", "aggregator-operator")
            channel = open_channel(aggregator.address, operator_tls if tls else None, insecure=not tls)
            try:
                stub = pb_grpc.AggregatorStub(channel)
                yield LocalServices(workdir, certs, aggregator, shuffler, stub, tls)
            finally:
                await channel.close()
        finally:
            await shuffler.stop()
    finally:
        await aggregator.stop()


def _server_tls(certs: DevCerts, role: str, tls: bool) -> ServerTls | None:
    """The role's certificate and key and its clients' CAs, from the throwaway CAs (None in plaintext)."""
    return certs.server_tls(role) if tls else None


def _shuffler_settings(workdir: Path, upstream: str, certs: DevCerts, tls: bool) -> dict[str, Any]:
    """The simulation's shuffler: no per-source quota, a long forwarding deadline."""
    return {
        "data_dir": workdir / "shuffler",
        "upstream": upstream,
        "listen": "127.0.0.1:0",
        "tls": _server_tls(certs, "shuffler", tls),
        "upstream_ca": certs.ca("aggregator") if tls else None,
        "insecure": not tls,
        "quota_per_source": 0,  # every simulated device shares 127.0.0.1
        # A 48 MiB chunk (~290k messages) takes the aggregator longer than the default 30 s
        # to decrypt on a loaded machine; a call past its deadline is cancelled uncounted
        # and retried (defaults run of multi_message_histogram: 4 chunks uncommitted for 6 min).
        "forward_deadline_s": 600.0,
    }


def simulate(
    request: pb.CreateCampaignRequest, values: Sequence[int], progress: bool = False
) -> pb.QueryResponse:
    """One campaign end to end in a temporary directory: create, devices report, close, answer.

    Blocking (``asyncio.run``); inside a running event loop (a notebook) use ``local_services``.
    """

    async def run(workdir: Path) -> pb.QueryResponse:
        async with local_services(workdir) as services:
            await services.create_campaign(request)
            await services.report(request.id, values, progress=progress)
            return await services.close_and_count(request.id, progress)

    with tempfile.TemporaryDirectory(prefix="deniable-sim-") as tmp:
        return asyncio.run(run(Path(tmp)))
