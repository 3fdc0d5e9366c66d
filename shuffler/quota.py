"""Per-source quotas: how many reports one address (and one device credential) may spool per campaign.

A source is known only as an HMAC of its address or certificate under a key drawn at start-up
and never written anywhere: the table holds no address, the spool and batches hold nothing of
the source, and nothing here is logged. Counts are per campaign per window (default an hour);
the table is bounded, and when it is full new sources are refused until the window turns.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import grpc

from deniable.core.errors import QuotaExceeded
from deniable.v1 import deniable_pb2 as pb

DEFAULT_QUOTA_PER_SOURCE: Final = 1000
DEFAULT_WINDOW_S: Final = 3600.0
DEFAULT_MAX_SOURCES: Final = 200_000

SourceKeys = tuple[bytes, ...]
"""Opaque keys of one caller: its address, and its credential if it showed one."""


def _host(peer: str) -> str:
    """The host of a gRPC peer (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``); ports change per connection."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0]
    return peer


@dataclass
class SourceQuota:
    """Reports per source per campaign per window; ``limit`` 0 means unlimited."""

    default_limit: int = DEFAULT_QUOTA_PER_SOURCE
    window_s: float = DEFAULT_WINDOW_S
    max_sources: int = DEFAULT_MAX_SOURCES
    clock: Callable[[], float] = time.monotonic
    _key: bytes = field(default_factory=lambda: os.urandom(32), repr=False)
    _used: dict[tuple[bytes, str], int] = field(default_factory=dict, repr=False)
    _window_start: float | None = field(default=None, repr=False)

    def keys(self, context: grpc.aio.ServicerContext[Any, Any]) -> SourceKeys:
        """The caller's opaque keys: its host, and its client certificate when it presented one."""
        found = [self._address_digest(_host(context.peer()))]
        pems = list(context.auth_context().get("x509_pem_cert", ()))
        if pems:
            found.append(self._digest(b"cert:" + pems[0]))
        return tuple(found)

    def address_keys(self, host: str) -> SourceKeys:
        """The opaque key of a host seen by another face (HTTPS: ``127.0.0.1``, ``::1``): the same
        key gRPC gives that host, so one device's reports count together whichever way they came."""
        return (self._address_digest(f"[{host}]" if ":" in host else host),)

    def _address_digest(self, host: str) -> bytes:
        return self._digest(b"addr:" + host.encode())

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
        new = sum(1 for slot, _ in wanted if slot not in self._used)
        if new and len(self._used) + new > self.max_sources:
            raise QuotaExceeded("too many sources this window; try again later")
        for (key, campaign), count in wanted:
            if self._used.get((key, campaign), 0) + count > limits.get(campaign, self.default_limit):
                raise QuotaExceeded(
                    f"over this source's quota of {limits.get(campaign, self.default_limit)} reports"
                    f" per campaign per {self.window_s:g} s"
                )
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

    @property
    def sources(self) -> int:
        """Slots (source, campaign) counted this window."""
        return len(self._used)
