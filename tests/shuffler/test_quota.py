"""Per-source quotas: the table (all or nothing, windows, bounds, refunds, opaque keys) and the
handlers' use of it on both submit paths (one campaign as raw bytes, several campaigns parsed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from deniable.core.errors import QuotaExceeded
from deniable.core.plumbing.service import status_code
from deniable.shuffler.quota import SourceQuota
from deniable.v1 import deniable_pb2 as pb

WAIT_FOREVER = {"batch_interval_s": 3600.0}


class FakeContext:
    """The two things ``SourceQuota.keys`` reads from a gRPC context."""

    def __init__(self, peer: str, cert: bytes | None = None) -> None:
        self._peer = peer
        self._cert = cert

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return {} if self._cert is None else {"x509_pem_cert": [self._cert]}


def _keys(quota: SourceQuota, peer: str, cert: bytes | None = None) -> tuple[bytes, ...]:
    context: Any = FakeContext(peer, cert)
    return quota.keys(context)


def test_keys_are_per_host_and_credential_and_hold_no_address() -> None:
    quota = SourceQuota()
    one = _keys(quota, "ipv4:10.1.2.3:40000")
    assert one == _keys(quota, "ipv4:10.1.2.3:40001")  # a new connection (port) is the same source
    assert one != _keys(quota, "ipv4:10.1.2.4:40000")
    assert _keys(quota, "ipv6:[::1]:5") == _keys(quota, "ipv6:[::1]:6")
    with_cert = _keys(quota, "ipv4:10.1.2.3:40000", b"cert A")
    assert len(with_cert) == 2 and with_cert[0] == one[0]
    assert with_cert[1] != _keys(quota, "ipv4:10.1.2.3:40000", b"cert B")[1]
    assert all(b"10.1.2.3" not in key and len(key) == 16 for key in with_cert)
    assert one != _keys(SourceQuota(), "ipv4:10.1.2.3:40000")  # keyed per process: not linkable


def test_the_https_face_keys_a_host_as_grpc_keys_its_peer() -> None:
    """One device, one quota over both ports: aiohttp's ``request.remote`` spelling of a host
    (no brackets, no port) gives the key gRPC gives ``ipv4:…:port`` / ``ipv6:[…]:port``."""
    quota = SourceQuota()
    assert quota.address_keys("127.0.0.1") == _keys(quota, "ipv4:127.0.0.1:5555")
    assert quota.address_keys("::1") == _keys(quota, "ipv6:[::1]:41000")
    assert quota.address_keys("127.0.0.2") != _keys(quota, "ipv4:127.0.0.1:5555")


def test_charges_are_all_or_nothing_per_campaign_and_key() -> None:
    quota = SourceQuota(default_limit=5)
    source = (b"address", b"credential")
    quota.charge(source, {"a": 3, "b": 5}, {"a": 5, "b": 5})
    with pytest.raises(QuotaExceeded):
        quota.charge(source, {"a": 2, "b": 1}, {"a": 5, "b": 5})  # b would be 6: a is not charged
    quota.charge(source, {"a": 2}, {"a": 5})  # a reaches exactly 5
    with pytest.raises(QuotaExceeded):
        quota.charge((b"other address", b"credential"), {"a": 1}, {"a": 5})  # same credential
    quota.charge((b"other address",), {"a": 1}, {"a": 5})
    quota.charge(source, {"c": 100}, {"c": 0})  # 0: this campaign has no limit
    assert status_code(QuotaExceeded("x")) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_campaign_override_refund_window_and_table_bound() -> None:
    now = [0.0]
    quota = SourceQuota(default_limit=2, window_s=10.0, max_sources=3, clock=lambda: now[0])
    assert quota.limit(pb.Campaign(id="x")) == 2
    assert quota.limit(pb.Campaign(id="x", quota_per_source=9)) == 9
    quota.charge((b"s",), {"a": 2}, {"a": 2})
    quota.refund((b"s",), {"a": 2})
    quota.charge((b"s",), {"a": 2}, {"a": 2})
    with pytest.raises(QuotaExceeded):
        quota.charge((b"s",), {"a": 1}, {"a": 2})
    quota.charge((b"t",), {"a": 1}, {"a": 2})
    quota.charge((b"u",), {"a": 1}, {"a": 2})
    with pytest.raises(QuotaExceeded, match="too many sources"):
        quota.charge((b"v",), {"a": 1}, {"a": 2})  # the table is full: fail closed, stay bounded
    assert quota.sources == 3
    now[0] = 10.0
    quota.charge((b"s",), {"a": 2}, {"a": 2})  # a new window
    quota.charge((b"v",), {"a": 1}, {"a": 2})
    assert quota.sources == 2


async def test_handlers_refuse_over_quota_on_both_paths_and_spool_nothing_of_it(
    upstream: Any, start: Any, kit: SimpleNamespace
) -> None:
    """Raw single-campaign requests and parsed mixed ones are charged alike; a refused request
    spools none of its reports; rejected reports cost nothing; with no source there is no quota."""
    small = upstream.fake.add(kit.make_campaign("small", n_min=100))
    large = upstream.fake.add(kit.make_campaign("large", n_min=100, quota_per_source=10))
    shuffler = await start(quota_per_source=3, **WAIT_FOREVER)
    handlers = shuffler.handlers
    source = (b"one device",)

    def raw(reports: list[pb.EncryptedReport]) -> Any:
        from deniable.shuffler.rawsubmit import RawSubmit

        return RawSubmit(pb.SubmitReportsRequest(reports=reports).SerializeToString())

    assert (await handlers.submit(raw(kit.make_reports(small, 2)), source)).accepted == 2
    with pytest.raises(QuotaExceeded):
        await handlers.submit(raw(kit.make_reports(small, 2)), source)
    bad = pb.EncryptedReport(campaign_id="small", key_id=small.key_id, ciphertext=b"short")
    mixed = pb.SubmitReportsRequest(reports=[*kit.make_reports(small, 1), bad, *kit.make_reports(large, 8)])
    answer = await handlers.submit(mixed, source)
    assert answer.accepted == 9 and len(answer.rejected) == 1  # small: 2 + 1 = 3, large: 8 of 10
    with pytest.raises(QuotaExceeded):
        await handlers.submit(pb.SubmitReportsRequest(reports=kit.make_reports(large, 3)), source)
    stats = {s.campaign_id: s.pending for s in (await handlers.stats()).campaigns}
    assert stats == {"small": 3, "large": 8}
    assert (await handlers.submit(pb.SubmitReportsRequest(reports=kit.make_reports(small, 5)))).accepted == 5
    assert shuffler.metrics.quota_refusals._value.get() == 2


async def test_a_negative_quota_is_a_configuration_error(start: Any) -> None:
    from deniable.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="quota"):
        await start(quota_per_source=-1)
    with pytest.raises(ConfigurationError, match="quota"):
        await start(quota_window_s=0.0)
