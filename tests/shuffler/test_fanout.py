"""Bounded fan-out (issue 20, item 8; ADR 0032): one request, one source, one /64 cannot make the
shuffler stampede the aggregator or fill the quota table."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest

from deniable.core.errors import QuotaExceeded
from deniable.shuffler import quota as quota_module
from deniable.shuffler.quota import DEFAULT_LOOKUPS_PER_REQUEST, LookupBudget, SourceQuota
from deniable.v1 import deniable_pb2 as pb

UNKNOWN = 256


def _unknown_request(
    kit: SimpleNamespace, prefix: str = "nope", count: int = UNKNOWN
) -> pb.SubmitReportsRequest:
    """One report for each of ``count`` distinct campaign ids nobody created."""
    reports = []
    for i in range(count):
        reports.extend(kit.make_reports(kit.make_campaign(f"{prefix}-{i}"), 1))
    return pb.SubmitReportsRequest(reports=reports)


async def test_one_request_naming_256_unknown_ids_asks_upstream_at_most_4_times(
    upstream: Any, start: Any, channel_to: Any, kit: SimpleNamespace
) -> None:
    shuffler = await start()
    shuffler.handlers.lookups = LookupBudget(clock=lambda: 0.0)  # time stands still: no refill
    stub = channel_to(shuffler)
    answer = await stub.SubmitReports(_unknown_request(kit), timeout=10)
    assert answer.accepted == 0
    assert {r.reason for r in answer.rejected} == {pb.UNKNOWN_CAMPAIGN}
    assert len(upstream.fake.get_campaign_calls) <= DEFAULT_LOOKUPS_PER_REQUEST == 4
    # The same source again and again: the bucket (burst 8) is the most it ever causes.
    for round_ in range(5):
        await stub.SubmitReports(_unknown_request(kit, f"more{round_}"), timeout=10)
    assert len(upstream.fake.get_campaign_calls) <= 8


async def test_known_unknown_ids_are_refused_locally(
    upstream: Any, start: Any, channel_to: Any, kit: SimpleNamespace
) -> None:
    """Once the aggregator said NOT_FOUND, the id is refused without asking (for negative_ttl_s)."""
    shuffler = await start(campaign_refresh_s=0.0)
    stub = channel_to(shuffler)
    request = pb.SubmitReportsRequest(reports=kit.make_reports(kit.make_campaign("ghost"), 1))
    for _ in range(20):
        answer = await stub.SubmitReports(request, timeout=5)
        assert answer.rejected[0].reason == pb.UNKNOWN_CAMPAIGN
    assert upstream.fake.get_campaign_calls == ["ghost"]
    sample = shuffler.metrics.registry.get_sample_value(
        "deniable_shuffler_lookups_refused_total", {"reason": "known_unknown"}
    )
    assert sample == 19


async def test_a_known_campaign_is_still_served_next_to_unknown_ones(
    upstream: Any, start: Any, channel_to: Any, kit: SimpleNamespace
) -> None:
    real = upstream.fake.add(kit.make_campaign("real"))
    shuffler = await start()
    stub = channel_to(shuffler)
    await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(real, 1)), timeout=5)
    shuffler.handlers.lookups = LookupBudget(clock=lambda: 0.0)
    mixed = _unknown_request(kit, count=UNKNOWN - 1)
    mixed.reports.extend(kit.make_reports(real, 1))
    answer = await stub.SubmitReports(mixed, timeout=10)
    assert answer.accepted == 1


async def test_without_the_budget_one_request_fans_out_256_times(
    upstream: Any, start: Any, channel_to: Any, kit: SimpleNamespace
) -> None:
    """The attack of issue 20 with the protection removed: every unknown id is asked upstream."""
    shuffler = await start()
    shuffler.handlers.lookups = LookupBudget(per_request=10**6, burst=10**6, clock=lambda: 0.0)
    await channel_to(shuffler).SubmitReports(_unknown_request(kit), timeout=10)
    assert len(upstream.fake.get_campaign_calls) == UNKNOWN


class _Context:
    """The two things SourceQuota reads of a gRPC context."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


def _flood_then_newcomer(quota: SourceQuota) -> None:
    """1,000 addresses of one /64 report once each; then a device from another prefix reports."""
    for i in range(1000):
        keys = quota.keys(_Context(f"ipv6:[2001:db8:0:1::{i:x}]:4000"))  # type: ignore[arg-type]
        with contextlib.suppress(QuotaExceeded):
            quota.charge(keys, {"c": 1}, {"c": 5000})
    newcomer = quota.keys(_Context("ipv6:[2001:db8:0:2::1]:4000"))  # type: ignore[arg-type]
    quota.charge(newcomer, {"c": 1}, {"c": 5000})


def test_a_flood_from_one_64_does_not_lock_out_new_devices() -> None:
    quota = SourceQuota(max_sources=100)
    _flood_then_newcomer(quota)  # no QuotaExceeded for the newcomer
    assert quota.sources == 2  # the whole /64 is one source, the newcomer the other


def test_per_address_sources_were_locked_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old keying (every IPv6 address its own source) lets one /64 fill the table."""
    monkeypatch.setattr(quota_module, "source_of_address", lambda host: host)
    with pytest.raises(QuotaExceeded, match="too many sources"):
        _flood_then_newcomer(SourceQuota(max_sources=100))


def test_ipv4_by_address_and_ipv4_mapped_alike() -> None:
    assert quota_module.source_of_address("192.0.2.7") == "192.0.2.7"
    assert quota_module.source_of_address("::ffff:192.0.2.7") == "192.0.2.7"
    assert quota_module.source_of_address("2001:db8::1") == quota_module.source_of_address("2001:db8::ffff")
    assert quota_module.source_of_address("2001:db8::1") != quota_module.source_of_address("2001:db8:0:1::1")


def test_one_source_cannot_hold_counters_for_every_campaign() -> None:
    quota = SourceQuota(max_slots_per_source=3)
    keys = quota.keys(_Context("ipv4:192.0.2.1:1"))  # type: ignore[arg-type]
    quota.charge(keys, {"a": 1, "b": 1, "c": 1}, {})
    with pytest.raises(QuotaExceeded, match="more than 3 campaigns"):
        quota.charge(keys, {"d": 1}, {})
    quota.charge(quota.keys(_Context("ipv4:192.0.2.2:1")), {"d": 1}, {})  # type: ignore[arg-type]
