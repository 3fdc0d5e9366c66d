"""Key administration: list, rotate and destroy aggregator keys, and sweep drained retired keys."""

from __future__ import annotations

import asyncio
import logging

from deniable.aggregator.context import HandlerContext
from deniable.aggregator.keys import RETIRED, KeyStateError
from deniable.aggregator.store import (
    StoreError,
)
from deniable.core.crypto import kem_named
from deniable.core.errors import (
    FailedPrecondition,
    InvalidRequest,
)
from deniable.v1 import deniable_pb2 as pb

log = logging.getLogger("deniable.aggregator")


class KeyHandlers:
    """The operator's key RPCs and the periodic sweep of retired keys."""

    def __init__(self, ctx: HandlerContext) -> None:
        """Work on the shared ``ctx`` (its keys lock orders every key state change)."""
        self._ctx = ctx

    async def list_keys(self) -> pb.ListKeysResponse:
        """Public metadata of every aggregator key (with the campaigns sealed to it) and the signing key.

        Keys are listed even while the store is down (without their campaigns)."""
        try:
            await self.sweep_keys()
            return await self.key_listing()
        except StoreError:
            return await self.key_listing(with_campaigns=False)

    async def key_listing(self, with_campaigns: bool = True) -> pb.ListKeysResponse:
        by_key: dict[int, list[str]] = {}
        for campaign in await self._ctx.store.list_campaigns() if with_campaigns else []:
            by_key.setdefault(campaign.key_id, []).append(campaign.id)
        infos = self._ctx.keyring.infos()
        for info in infos:
            info.campaigns.extend(by_key.get(info.key_id, []))
        return pb.ListKeysResponse(keys=infos, signing_public_key=self._ctx.keyring.signing.public_raw)

    async def rotate_key(self, request: pb.KeyRotateRequest) -> pb.KeyInfo:
        """A new active key for the KEM; the old one is retired and still decrypts."""
        try:
            kem = kem_named(request.kem).name
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        async with self._ctx.keys_lock:
            pair = await asyncio.to_thread(self._ctx.keyring.rotate, kem)
        await self.sweep_keys()
        return await self._key_info(pair.key_id)

    async def destroy_key(self, request: pb.KeyDestroyRequest) -> pb.KeyInfo:
        """Destroy a retired key now (the operator has drained it); refused while a campaign sealed
        to it is open."""
        async with self._ctx.keys_lock:
            open_campaigns = await self._open_campaigns_of(request.key_id)
            if open_campaigns:
                raise FailedPrecondition(
                    f"key {request.key_id} still serves open campaigns ({', '.join(open_campaigns[:5])});"
                    " close them and let the shuffler drain them first"
                )
            try:
                await asyncio.to_thread(self._ctx.keyring.destroy, request.key_id)
            except KeyStateError as exc:
                raise FailedPrecondition(str(exc)) from None
        return await self._key_info(request.key_id)

    async def sweep_keys(self) -> list[int]:
        """Destroy every retired key whose campaigns all closed at least ``key_drain_s`` ago."""
        if not any(info.state == RETIRED for info in self._ctx.keyring.infos()):
            return []
        async with self._ctx.keys_lock:
            retired = [info.key_id for info in self._ctx.keyring.infos() if info.state == RETIRED]
            now = self._ctx.clock()
            campaigns = await self._ctx.store.list_campaigns()
            destroyed = []
            for key_id in retired:
                sealed = [c for c in campaigns if c.key_id == key_id]
                if all(self._ctx.closed(c, now - self._ctx.key_drain_s) for c in sealed):
                    await asyncio.to_thread(self._ctx.keyring.destroy, key_id)
                    destroyed.append(key_id)
            return destroyed

    async def _open_campaigns_of(self, key_id: int) -> list[str]:
        now = self._ctx.clock()
        return [
            c.id
            for c in await self._ctx.store.list_campaigns()
            if c.key_id == key_id and not self._ctx.closed(c, now)
        ]

    async def _key_info(self, key_id: int) -> pb.KeyInfo:
        listing = await self.key_listing()
        return next(info for info in listing.keys if info.key_id == key_id)
