"""A real aggregator and shuffler on loopback for SDK tests (packaging, README snippets, vectors)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from deniable.core.plumbing.certs import DEV_ROLES, write_dev_certs
from deniable.core.plumbing.tls import open_channel
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc
from support.stack import tls_pair


@dataclass
class Services:
    """Addresses, the operator's aggregator stub, the campaigns as created, and a flush."""

    aggregator_address: str
    shuffler_address: str
    operator: pb_grpc.AggregatorAsyncStub
    campaigns: list[pb.Campaign]
    certs: Path
    signing_key: str
    """The aggregator's Ed25519 signing public key (hex): what an app pins."""
    flush: Callable[[], Awaitable[pb.FlushResponse]]


def binary_campaign(campaign_id: str, n_min: int = 1, epsilon0: float = 1.0) -> pb.CreateCampaignRequest:
    """A binary randomised-response campaign small enough to release with one report."""
    return pb.CreateCampaignRequest(
        id=campaign_id,
        question="Is it on?",
        kind=pb.BINARY,
        mechanism=pb.BINARY_RR,
        epsilon0=epsilon0,
        delta=1e-6,
        n_min=n_min,
    )


def categorical_campaign(campaign_id: str, labels: Sequence[str], n_min: int = 1) -> pb.CreateCampaignRequest:
    """A k-ary randomised-response (GRR) campaign."""
    return pb.CreateCampaignRequest(
        id=campaign_id,
        question="Which one?",
        kind=pb.CATEGORICAL,
        labels=list(labels),
        mechanism=pb.GRR,
        epsilon0=1.0,
        delta=1e-6,
        n_min=n_min,
    )


@asynccontextmanager
async def running_services(
    workdir: Path, requests: Sequence[pb.CreateCampaignRequest]
) -> AsyncIterator[Services]:
    """Start an aggregator and a shuffler (TLS on loopback, development certificates in
    ``workdir/certs``: devices verify the shuffler with ``certs/shuffler-ca.pem``), create ``requests``."""
    certs = write_dev_certs(workdir / "certs", roles=DEV_ROLES)
    async with tls_pair(workdir, certs) as (aggregator, shuffler):
        operator_tls = certs.client_tls("aggregator", "aggregator-operator")
        channel = open_channel(aggregator.address, operator_tls)
        operator = pb_grpc.AggregatorStub(channel)
        created = [await operator.CreateCampaign(request, timeout=120) for request in requests]
        keys = await operator.ListKeys(pb.ListKeysRequest(), timeout=30)
        yield Services(
            aggregator.address,
            shuffler.address,
            operator,
            created,
            certs.directory,
            keys.signing_public_key.hex(),
            shuffler.flush,
        )
        await channel.close()


async def counted(
    services: Services, campaign_id: str, expected: int, timeout_s: float = 60
) -> pb.QueryResponse:
    """Flush the shuffler and poll the aggregator until ``expected`` messages are counted or rejected."""
    await services.flush()
    kind = next(c.kind for c in services.campaigns if c.id == campaign_id)
    rpc = services.operator.BinarySum if kind == pb.BINARY else services.operator.Histogram
    deadline = time.monotonic() + timeout_s
    while True:
        answer: pb.QueryResponse = await rpc(pb.QueryRequest(campaign_id=campaign_id), timeout=30)
        if answer.messages + answer.rejected >= expected or time.monotonic() > deadline:
            return answer
        await asyncio.sleep(0.05)
