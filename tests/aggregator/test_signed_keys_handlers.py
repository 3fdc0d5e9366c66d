"""Aggregator handlers: every description served is signed (and re-signed when it changes), per-
campaign KEM, key rotation, destruction refused while a campaign is open, the drain sweep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.clock import Clock

from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.store import SqliteAggregatorStore
from deniable.core.crypto import HYBRID_SUITE_NAME, SUITE_NAME, verify_campaign
from deniable.core.errors import ConfigurationError, FailedPrecondition, InvalidRequest
from deniable.v1 import deniable_pb2 as pb


@pytest.fixture
async def timed(tmp_path: Path) -> AsyncIterator[tuple[AggregatorHandlers, Clock]]:
    clock = Clock()
    store = SqliteAggregatorStore(tmp_path / "h.sqlite3")
    keyring = Keyring.load_or_create(tmp_path / "data")
    yield AggregatorHandlers(store, keyring, AggregatorMetrics(), clock=clock, key_drain_s=100.0), clock
    await store.close()


def _request(campaign_id: str, kem: str = "", end: int = 0) -> pb.CreateCampaignRequest:
    return pb.CreateCampaignRequest(
        id=campaign_id, question="q", kind=pb.BINARY, epsilon0=1.0, kem=kem, window_end_unix=end
    )


async def test_every_served_description_is_signed_and_re_signed_on_close(
    timed: tuple[AggregatorHandlers, Clock],
) -> None:
    handlers, clock = timed
    pinned = handlers.keyring.signing.public_raw
    created = await handlers.create_campaign(_request("c1"))
    verify_campaign(created, pinned)
    fetched = await handlers.get_campaign(pb.GetCampaignRequest(campaign_id="c1"))
    assert fetched == created
    (listed,) = (await handlers.list_campaigns()).campaigns
    assert listed == created
    closed = await handlers.close_campaign(pb.KeyCloseCampaignRequest(campaign_id="c1"))
    assert closed.window_end_unix == int(clock.now) and closed.signature != created.signature
    verify_campaign(closed, pinned)
    assert await handlers.get_campaign(pb.GetCampaignRequest(campaign_id="c1")) == closed
    clock.now += 50
    again = await handlers.close_campaign(pb.KeyCloseCampaignRequest(campaign_id="c1"))
    assert again == closed  # closing twice keeps the first end
    keys = await handlers.list_keys()
    assert keys.signing_public_key == pinned and list(keys.keys[0].campaigns) == ["c1"]


async def test_kem_is_chosen_per_campaign(timed: tuple[AggregatorHandlers, Clock]) -> None:
    handlers, _ = timed
    classic = await handlers.create_campaign(_request("c1"))
    hybrid = await handlers.create_campaign(_request("c2", kem="x25519-mlkem768"))
    assert (classic.hpke_suite, classic.key_id) == (SUITE_NAME, 1)
    assert (hybrid.hpke_suite, hybrid.key_id, len(hybrid.public_key)) == (HYBRID_SUITE_NAME, 2, 1216)
    assert hybrid.ciphertext_length == classic.ciphertext_length - 48 + 1136
    with pytest.raises(InvalidRequest, match="unknown KEM"):
        await handlers.create_campaign(_request("c3", kem="rsa"))
    with pytest.raises(InvalidRequest, match="unknown KEM"):
        await handlers.rotate_key(pb.KeyRotateRequest(kem="rsa"))


async def test_retired_key_is_destroyed_only_after_its_campaigns_closed_and_drained(
    timed: tuple[AggregatorHandlers, Clock], tmp_path: Path
) -> None:
    handlers, clock = timed
    await handlers.create_campaign(_request("open"))
    await handlers.create_campaign(_request("ends", end=int(clock.now) + 10))
    rotated = await handlers.rotate_key(pb.KeyRotateRequest())
    assert (rotated.key_id, rotated.state) == (2, "active")
    key_file = tmp_path / "data" / "keys" / "1.key"
    with pytest.raises(FailedPrecondition, match="open"):
        await handlers.destroy_key(pb.KeyDestroyRequest(key_id=1))
    with pytest.raises(FailedPrecondition, match="active"):
        await handlers.destroy_key(pb.KeyDestroyRequest(key_id=2))
    await handlers.close_campaign(pb.KeyCloseCampaignRequest(campaign_id="open"))
    clock.now += 60  # both closed, but "open" closed only 60 s ago: still draining
    assert await handlers.sweep_keys() == [] and key_file.exists()
    clock.now += 50  # 110 s after the last close > key_drain_s = 100
    assert await handlers.sweep_keys() == [1] and not key_file.exists()
    states = [(k.key_id, k.state) for k in (await handlers.list_keys()).keys]
    assert states == [(1, "destroyed"), (2, "active")]
    # Reports sealed to a destroyed key are no longer decryptable: they are rejected, not counted.
    assert handlers.keyring.get(1) is None


class SlowCreateStore(SqliteAggregatorStore):
    """A store whose create_campaign waits for ``release``: a rotation can arrive meanwhile."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def create_campaign(self, campaign: pb.Campaign) -> None:
        self.entered.set()
        await self.release.wait()
        await super().create_campaign(campaign)


async def test_a_rotation_during_campaign_creation_never_destroys_the_campaigns_key(tmp_path: Path) -> None:
    """Key 1 is picked for a campaign still being stored when a rotation retires key 1 and sweeps
    (drain 0): without the keys lock the sweep sees no campaign on key 1 and destroys it, and every
    report to the new campaign would be undecryptable."""
    store = SlowCreateStore(tmp_path / "slow.sqlite3")
    keyring = Keyring.load_or_create(tmp_path / "data")
    handlers = AggregatorHandlers(store, keyring, AggregatorMetrics(), key_drain_s=0.0)
    try:
        creating = asyncio.create_task(handlers.create_campaign(_request("c1")))
        await store.entered.wait()
        rotating = asyncio.create_task(handlers.rotate_key(pb.KeyRotateRequest()))
        await asyncio.sleep(0.05)  # let the rotation run as far as it can
        store.release.set()
        created, rotated = await creating, await rotating
        assert (created.key_id, rotated.key_id) == (1, 2)
        assert keyring.state_of(1) == "retired" and keyring.get(1) is not None
    finally:
        await store.close()


async def test_a_negative_drain_period_is_a_configuration_error(tmp_path: Path) -> None:
    """A negative drain would count campaigns that close in the future as drained."""
    with pytest.raises(ConfigurationError, match="key_drain_s"):
        await start_aggregator(AggregatorConfig(data_dir=tmp_path, listen="127.0.0.1:0", key_drain_s=-1.0))
