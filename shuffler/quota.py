"""Per-source quotas: how many reports one address (and one device credential) may spool per campaign.

A source is known only as an HMAC of its address or certificate under a key drawn at start-up
and never written anywhere: the table holds no address, the spool and batches hold nothing of
the source, and nothing here is logged. Counts are per campaign per window (default an hour);
the table is bounded, and when it is full new sources are refused until the window turns.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import grpc

from deniable.core.errors import QuotaExceeded
from deniable.v1 import deniable_pb2 as pb

DEFAULT_QUOTA_PER_SOURCE: Final = 1000
DEFAULT_WINDOW_S: Final = 3600.0
DEFAULT_MAX_SOURCES: Final = 200_000
DEFAULT_MAX_SLOTS_PER_SOURCE: Final = 64
"""Campaigns one source (address, /64 or credential) may hold counters for in one window."""
DEFAULT_LOOKUPS_PER_REQUEST: Final = 4
DEFAULT_LOOKUPS_PER_SOURCE_PER_S: Final = 2.0
DEFAULT_LOOKUP_BURST: Final = 8

SourceKeys = tuple[bytes, ...]
"""Opaque keys of one caller: its address, and its credential if it showed one."""


def _host(peer: str) -> str:
    """The source of a gRPC peer (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``): an IPv4 address, an
    IPv6 /64 (one subscriber's prefix: its addresses are free to it), else the peer string."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    host = rest.rsplit(":", 1)[0].strip("[]")
    return source_of_address(host)


def source_of_address(host: str) -> str:
    """IPv4 (and IPv4-mapped IPv6) by address, IPv6 by its /64; anything else as given."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass
class SourceQuota:
    """Reports per source per campaign per window; ``limit`` 0 means unlimited."""

    default_limit: int = DEFAULT_QUOTA_PER_SOURCE
    window_s: float = DEFAULT_WINDOW_S
    max_sources: int = DEFAULT_MAX_SOURCES
    clock: Callable[[], float] = time.monotonic
    max_slots_per_source: int = DEFAULT_MAX_SLOTS_PER_SOURCE
    _key: bytes = field(default_factory=lambda: os.urandom(32), repr=False)
    _used: dict[tuple[bytes, str], int] = field(default_factory=dict, repr=False)
    _slots: dict[bytes, int] = field(default_factory=dict, repr=False)
    _window_start: float | None = field(default=None, repr=False)

    def keys(self, context: grpc.aio.ServicerContext[Any, Any]) -> SourceKeys:
        """The caller's opaque keys: its host, and its client certificate when it presented one."""
        found = [self._digest(b"addr:" + _host(context.peer()).encode())]
        pems = list(context.auth_context().get("x509_pem_cert", ()))
        if pems:
            found.append(self._digest(b"cert:" + pems[0]))
        return tuple(found)

    def address_keys(self, host: str) -> SourceKeys:
        """The opaque key of a host seen by another face (HTTPS: ``127.0.0.1``, ``::1``): the same
        key gRPC gives that host (IPv4 address, IPv6 /64), so one device's reports count together
        whichever way they came."""
        return (self._digest(b"addr:" + source_of_address(host).encode()),)

    def user_keys(self, user: str | None) -> SourceKeys:
        """The opaque key of an MQTT broker login (None: the one shared key of devices without one)."""
        return (self._digest(b"mqtt-user:" + (user or "").encode()),)

    def _digest(self, data: bytes) -> bytes:
        return hmac.new(self._key, data, hashlib.sha256).digest()[:16]

    def limit(self, campaign: pb.Campaign) -> int:
        """The campaign's own quota if it sets one, else the shuffler's default."""
        return int(campaign.quota_per_source) or self.default_limit

    def charge(self, source: SourceKeys, demand: Mapping[str, int], limits: Mapping[str, int]) -> None:
        """Count ``demand`` (reports per campaign) against every key of ``source``, all or nothing.

        QuotaExceeded, and nothing counted, if any key would pass its campaign's limit.
        """
        self._turn_window()
        wanted = [
            ((key, campaign), count)
            for campaign, count in demand.items()
            if limits.get(campaign, self.default_limit) > 0 and count > 0
            for key in source
        ]
        fresh = [key for (key, campaign), _ in wanted if (key, campaign) not in self._used]
        for key in set(fresh):
            if self._slots.get(key, 0) + fresh.count(key) > self.max_slots_per_source:
                raise QuotaExceeded(
                    f"this source reports to more than {self.max_slots_per_source} campaigns"
                    f" per {self.window_s:g} s"
                )
        if fresh and len(self._used) + len(fresh) > self.max_sources:
            raise QuotaExceeded("too many sources this window; try again later")
        for (key, campaign), count in wanted:
            if self._used.get((key, campaign), 0) + count > limits.get(campaign, self.default_limit):
                raise QuotaExceeded(
                    f"over this source's quota of {limits.get(campaign, self.default_limit)} reports"
                    f" per campaign per {self.window_s:g} s"
                )
        for key in fresh:
            self._slots[key] = self._slots.get(key, 0) + 1
        for slot, count in wanted:
            self._used[slot] = self._used.get(slot, 0) + count

    def refund(self, source: SourceKeys, demand: Mapping[str, int]) -> None:
        """Give back a charge whose reports were not spooled after all."""
        for campaign, count in demand.items():
            for key in source:
                slot = (key, campaign)
                if slot in self._used:
                    self._used[slot] = max(0, self._used[slot] - count)

    def _turn_window(self) -> None:
        now = self.clock()
        if self._window_start is None or now - self._window_start >= self.window_s:
            self._window_start = now
            self._used.clear()
            self._slots.clear()

    @property
    def sources(self) -> int:
        """Slots (source, campaign) counted this window."""
        return len(self._used)


@dataclass
class LookupBudget:
    """Upstream campaign look-ups: at most ``per_request`` per request and a token bucket per
    source (``rate_per_s``, up to ``burst``), so unknown ids cannot fan out to the aggregator.

    The bucket table is bounded (least recently used source forgotten first: a forgotten source
    starts again with a full bucket, which only favours it, never locks anyone out).
    """

    per_request: int = DEFAULT_LOOKUPS_PER_REQUEST
    rate_per_s: float = DEFAULT_LOOKUPS_PER_SOURCE_PER_S
    burst: int = DEFAULT_LOOKUP_BURST
    max_sources: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _buckets: OrderedDict[bytes, tuple[float, float]] = field(default_factory=OrderedDict, repr=False)

    def take(self, source: SourceKeys) -> bool:
        """One look-up for ``source`` (its address key; a shared bucket if it has none)."""
        key = source[0] if source else b""
        now = self.clock()
        tokens, at = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate_per_s)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > self.max_sources:
            self._buckets.popitem(last=False)
        return allowed
