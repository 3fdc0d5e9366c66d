"""The aggregator's logic, free of gRPC: one facade over the campaign, ingest, query and key handlers.

Failures are ``deniable.core.errors`` exceptions; the servicer maps each to one gRPC status. Each
concern lives in its own module (``campaigns``, ``ingest``, ``queries``, ``key_admin``) over one
shared ``HandlerContext``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor

from deniable.aggregator.campaigns import CampaignHandlers
from deniable.aggregator.context import (
    DEFAULT_CLOSE_GRACE_S,
    DEFAULT_KEY_DRAIN_S,
    DEFAULT_RETENTION_MARGIN_S,
    HandlerContext,
)
from deniable.aggregator.ingest import IngestHandlers
from deniable.aggregator.key_admin import KeyHandlers
from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.pool import DecryptPool
from deniable.aggregator.queries import QueryHandlers
from deniable.aggregator.store import AggregatorStore


class AggregatorHandlers:
    """Every aggregator RPC as a plain coroutine over protobuf messages (what servicer and NATS call)."""

    def __init__(
        self,
        store: AggregatorStore,
        keyring: Keyring,
        metrics: AggregatorMetrics | None = None,
        executor: Executor | DecryptPool | None = None,
        decrypt_workers: int = 0,
        clock: Callable[[], float] = time.time,
        key_drain_s: float = DEFAULT_KEY_DRAIN_S,
        retention_margin_s: float = DEFAULT_RETENTION_MARGIN_S,
        close_grace_s: float = DEFAULT_CLOSE_GRACE_S,
    ) -> None:
        """``executor`` runs decryption (None: the loop's default; a ``DecryptPool`` is healed when
        a worker dies); ``decrypt_workers`` sets chunking; ``key_drain_s``: how long after its
        campaigns close a retired key is destroyed; ``close_grace_s``: how long after a campaign's
        window ends a batch is still counted."""
        ctx = HandlerContext(
            store,
            keyring,
            metrics or AggregatorMetrics(),
            clock,
            key_drain_s,
            retention_margin_s,
            close_grace_s,
        )
        self.store, self.keyring, self.metrics, self.last_batch = (
            ctx.store,
            keyring,
            ctx.metrics,
            ctx.last_batch,
        )
        keys = KeyHandlers(ctx)
        campaigns = CampaignHandlers(ctx, keys)
        ingest = IngestHandlers(ctx, executor, decrypt_workers)
        self.pool = ingest.pool
        self.create_campaign = campaigns.create_campaign
        self.save_campaign = campaigns.save_campaign
        self.release_below_n_min = campaigns.release_below_n_min
        self.get_campaign = campaigns.get_campaign
        self.list_campaigns = campaigns.list_campaigns
        self.close_campaign = campaigns.close_campaign
        self.status = campaigns.status
        self.delete_campaign = campaigns.delete_campaign
        self.collect_garbage = campaigns.collect_garbage
        self.ingest_batch = ingest.ingest_batch
        self.query = QueryHandlers(ctx).query
        self.list_keys = keys.list_keys
        self.rotate_key = keys.rotate_key
        self.destroy_key = keys.destroy_key
        self.sweep_keys = keys.sweep_keys
