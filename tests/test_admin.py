"""``deniable.admin``: operator actions from Python, without the CLI, against real TLS services."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from support.stack import tls_pair

from deniable.admin.campaigns import (
    CampaignSpec,
    campaign_dict,
    close_campaign,
    create_campaign,
    delete_campaign,
    get_campaign,
    list_campaigns,
)
from deniable.admin.health import SERVICES, check
from deniable.admin.keys import destroy_key, key_row, list_keys, read_keys, rotate_key
from deniable.admin.privacy import amplification, profile_table
from deniable.admin.queries import query
from deniable.admin.rpc import call
from deniable.admin.shuffler import flush, release_below_n_min, spool, spool_rows
from deniable.admin.status import gather_status
from deniable.aggregator import RunningAggregator
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.certs import DevCerts
from deniable.core.plumbing.tls import INSECURE, ClientTls
from deniable.shuffler import RunningShuffler
from deniable.v1 import deniable_pb2 as pb

NOW = 1_800_000_000.0


@dataclass
class Deployment:
    aggregator: RunningAggregator
    shuffler: RunningShuffler
    operator: ClientTls
    data_dir: Path
    shuffler_operator: ClientTls


@pytest.fixture
async def deployment(tmp_path: Path, dev_certs: DevCerts) -> AsyncIterator[Deployment]:
    async with tls_pair(tmp_path, dev_certs, grace=1.0, operator_listen="127.0.0.1:0") as (
        aggregator,
        shuffler,
    ):
        operator = dev_certs.client_tls("aggregator", "aggregator-operator")
        shuffler_operator = dev_certs.client_tls("shuffler", "shuffler-operator")
        yield Deployment(aggregator, shuffler, operator, tmp_path / "agg", shuffler_operator)


def test_spec_builds_the_request_and_checks_planning_inputs() -> None:
    spec = CampaignSpec(id="c", question="Which?", kind="categorical", labels=[" a", "b ", ""], epsilon0=1.0)
    request = spec.request(NOW)
    assert (request.kind, list(request.labels), request.epsilon0) == (pb.CATEGORICAL, ["a", "b"], 1.0)
    assert request.mechanism == pb.MECHANISM_UNSPECIFIED
    timed = CampaignSpec(
        id="c", question="?", kind="binary", mechanism="binary_rr", epsilon0=1.0, window="2h"
    )
    assert (timed.request(NOW).window_s, timed.request(NOW).mechanism) == (7200, pb.BINARY_RR)
    with pytest.raises(ValueError, match="--target-epsilon and --expected-n go together"):
        CampaignSpec(id="c", question="?", kind="binary", target_epsilon=1.0).request(NOW)
    with pytest.raises(ValueError, match="--window"):
        CampaignSpec(id="c", question="?", kind="binary", epsilon0=1.0, window="soon").request(NOW)


def test_privacy_tables_are_library_functions() -> None:
    amplified = amplification("grr", 1.0, 10_000, 1e-6, 4)
    assert amplified["local_privacy"] and amplified["analyses"]
    assert amplified["epsilon"] == min(row["epsilon"] for row in amplified["analyses"])
    profile = profile_table("grr", 1.0, 10_000, 4, 1e-6, 10_000, None, 5)
    assert len(profile["profile"]) == 5 and all(math.isfinite(r["delta"]) for r in profile["profile"])
    with pytest.raises(ValueError, match="--epsilon must be a finite number"):
        profile_table("grr", 1.0, 10_000, 4, 1e-6, 10_000, [float("nan")], 5)


async def test_operator_actions_without_the_cli(deployment: Deployment) -> None:
    agg, shuf, tls = deployment.aggregator.address, deployment.shuffler.operator_address, deployment.operator
    assert shuf is not None
    spec = CampaignSpec(id="admin-1", question="On?", kind="binary", epsilon0=1.0, n_min=5)
    created = await create_campaign(agg, spec, tls)
    assert (await get_campaign(agg, "admin-1", tls)).id == created.id
    assert [c.id for c in await list_campaigns(agg, tls)] == ["admin-1"]
    assert campaign_dict(created)["local_guarantee"] is True

    keys = await list_keys(agg, tls)
    assert [key_row(k)["key_id"] for k in keys.keys] == [created.key_id]
    rotated = await rotate_key(agg, "x25519", tls)
    assert rotated.key_id != created.key_id and rotated.active

    shuf_tls = deployment.shuffler_operator  # the shuffler's own operator, not the aggregator's
    assert spool_rows(await spool(shuf, shuf_tls)) == []
    flushed = await flush(shuf, shuf_tls)
    assert flushed.reports_forwarded == 0
    with pytest.raises(ValueError, match="--below-n-min needs --campaign"):
        await release_below_n_min(agg, "", tls)

    status = await gather_status(agg, [shuf, "127.0.0.1:1"], tls, shuf_tls)
    assert [c["id"] for c in status["campaigns"]] == ["admin-1"]
    assert "error" in status["shufflers"][1] and status["shufflers"][0]["campaigns"] == []

    closed = await close_campaign(agg, "admin-1", tls)
    assert closed.closed
    deleted = await delete_campaign(agg, "admin-1", [shuf], tls, shuf_tls)
    assert (deleted.campaign_id, deleted.counted) == ("admin-1", 0)
    assert await check(agg, SERVICES["aggregator"], tls, 3.0) == "SERVING"


async def test_delete_asks_the_named_shufflers_first(deployment: Deployment) -> None:
    """The shufflers are asked before the aggregator: an unreachable one fails the call; nothing deleted."""
    agg, tls = deployment.aggregator.address, deployment.operator
    await create_campaign(agg, CampaignSpec(id="admin-2", question="?", kind="binary", epsilon0=1.0), tls)
    with pytest.raises(Exception) as refused:
        await delete_campaign(agg, "admin-2", ["127.0.0.1:1"], tls)
    assert not isinstance(refused.value, ConfigurationError)
    assert (await get_campaign(agg, "admin-2", tls)).id == "admin-2"


async def test_query_and_destroy_answer_like_the_service(deployment: Deployment) -> None:
    agg, tls = deployment.aggregator.address, deployment.operator
    await create_campaign(agg, CampaignSpec(id="admin-3", question="?", kind="binary", epsilon0=1.0), tls)
    answer = await query(agg, pb.QueryRequest(campaign_id="admin-3", confidence=0.95), tls, binary=True)
    assert answer.n == 0 and len(answer.buckets) == 2
    with pytest.raises(grpc.aio.AioRpcError, match="still serves open campaigns"):
        await destroy_key(agg, (await list_keys(agg, tls)).keys[0].key_id, tls)


async def test_health_of_nothing_is_unreachable() -> None:
    assert (await check("127.0.0.1:1", "", INSECURE, 1.0)).startswith("UNREACHABLE(")


async def test_a_missing_tls_setting_never_means_plaintext() -> None:
    """``tls=None`` is refused before any connection (issue 20 item 9); plaintext only by name."""
    with pytest.raises(ConfigurationError, match="--insecure by name"):
        await call("127.0.0.1:1", lambda s: s.ListKeys(pb.ListKeysRequest(), timeout=1), tls=None)
    with pytest.raises(ConfigurationError, match="--insecure by name"):
        await check("127.0.0.1:1", "", None, 1.0)  # type: ignore[arg-type]
    for chosen in ({"tls": INSECURE}, {"insecure": True}):  # the control: by name it is attempted
        with pytest.raises(grpc.aio.AioRpcError):
            await call("127.0.0.1:1", lambda s: s.ListKeys(pb.ListKeysRequest(), timeout=1), **chosen)


def test_read_keys_from_a_data_directory(tmp_path: Path) -> None:
    from deniable.aggregator.keys import Keyring

    keyring = Keyring.load_or_create(tmp_path)
    listing = read_keys(tmp_path)
    assert listing.signing_public_key == keyring.signing.public_raw
    assert [k.key_id for k in listing.keys] == [k.key_id for k in keyring.infos()]
