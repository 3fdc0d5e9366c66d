"""What keeps a shuffler NOT_SERVING: a spool it cannot write, an upstream that does not answer.

``spool_check`` writes and fsyncs a small probe file beside the spool (a full disk fails it) and
clears a failure the handlers saw once the probe passes. ``UpstreamCheck`` asks the upstream's
gRPC health service about ``deniable.v1.Aggregator``: an answer (SERVING or NOT_SERVING) means an
aggregator answered; UNAVAILABLE or DEADLINE_EXCEEDED (unreachable), NOT_FOUND or UNIMPLEMENTED
(something else listens there) do not. Before the first answer, or when the last one is older
than the grace, the shuffler is NOT_SERVING: reports are still spooled, but nothing is forwarded.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deniable.shuffler.handlers import ShufflerHandlers

PROBE_FILE: Final = ".health-probe"
PROBE_BYTES: Final = b"\0" * 4096
AGGREGATOR_SERVICE: Final = "deniable.v1.Aggregator"
NOT_AN_AGGREGATOR: Final = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED)
DEFAULT_UPSTREAM_GRACE_S: Final = 30.0


def _probe_write(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, PROBE_BYTES)
        os.fsync(fd)
    finally:
        os.close(fd)


def spool_check(
    data_dir: Path, handlers: ShufflerHandlers, store: object = None
) -> Callable[[], Awaitable[str | None]]:
    """Health check: the spool's directory takes a 4 KiB fsync'd write (and the last append worked);
    a spool with a ``ping`` (PostgreSQL) must answer it too."""
    ping = getattr(store, "ping", None)

    async def check() -> str | None:
        try:
            await asyncio.to_thread(_probe_write, data_dir / PROBE_FILE)
        except OSError as exc:
            return f"the spool directory cannot be written: {exc.strerror or exc}"
        if callable(ping):
            try:
                await asyncio.to_thread(ping)
            except OSError as exc:
                return f"the spool store does not answer: {exc}"
        handlers.spool_failure = None
        return None

    return check


class UpstreamCheck:
    """Health check: the upstream answered as an aggregator within the last ``grace_s`` seconds."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        address: str,
        grace_s: float = DEFAULT_UPSTREAM_GRACE_S,
        deadline_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Probe the health service on ``channel`` (``address`` names it in messages)."""
        self._health = health_pb2_grpc.HealthStub(channel)
        self._address = address
        self._grace = grace_s
        self._deadline = deadline_s
        self._clock = clock
        self.last_answer: float | None = None
        self.last_problem = "has not answered yet"

    async def _ask(self) -> None:
        request = health_pb2.HealthCheckRequest(service=AGGREGATOR_SERVICE)
        try:
            await self._health.Check(request, timeout=self._deadline)
        except grpc.aio.AioRpcError as exc:
            what = "is not an aggregator" if exc.code() in NOT_AN_AGGREGATOR else "is unreachable"
            self.last_problem = f"{what} ({exc.code().name})"
            return
        self.last_answer = self._clock()

    async def __call__(self) -> str | None:
        """None while the aggregator answered within the grace, else why not."""
        await self._ask()
        if self.last_answer is not None and self._clock() - self.last_answer <= self._grace:
            return None
        if self.last_answer is None:
            return f"upstream {self._address} {self.last_problem}"
        silent = self._clock() - self.last_answer
        return f"upstream {self._address} {self.last_problem} for {silent:.0f} s (grace {self._grace:g} s)"
