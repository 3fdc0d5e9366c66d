"""Health that tells the truth: named checks polled in the background set the gRPC health status.

Each check returns None while its dependency works, or a one-line reason while it does not. The
service is NOT_SERVING while any check fails and SERVING again by itself when all pass; every
change is logged once with its reason, and a gauge per condition shows which one failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio
from prometheus_client import CollectorRegistry, Gauge

Check = Callable[[], Awaitable[str | None]]
"""None while the dependency works, else why it does not (one line)."""

DEFAULT_INTERVAL_S: Final = 1.0
CHECK_TIMEOUT_S: Final = 5.0
SERVING: Final = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: Final = health_pb2.HealthCheckResponse.NOT_SERVING
log = logging.getLogger("deniable.health")


class HealthMonitor:
    """Polls ``checks`` every ``interval_s`` and sets ``servicer`` for ``names`` accordingly."""

    def __init__(
        self,
        servicer: health_aio.HealthServicer,
        names: Sequence[str],
        checks: Mapping[str, Check],
        registry: CollectorRegistry,
        prefix: str,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        """``prefix`` names the gauge, e.g. ``deniable_aggregator`` → ``deniable_aggregator_unhealthy``."""
        self._servicer = servicer
        self._names = ("", *names)
        self._checks = dict(checks)
        self._interval = interval_s
        self._task: asyncio.Task[None] | None = None
        self.failing: dict[str, str] = {}
        self._published: bool | None = None
        self.unhealthy = Gauge(
            f"{prefix}_unhealthy",
            "1 while this condition keeps the service NOT_SERVING, else 0.",
            ["condition"],
            registry=registry,
        )
        for name in self._checks:
            self.unhealthy.labels(condition=name).set(0)

    @property
    def serving(self) -> bool:
        """Whether the last round found every dependency working."""
        return not self.failing

    async def _run_check(self, name: str, check: Check) -> str | None:
        try:
            return await asyncio.wait_for(check(), CHECK_TIMEOUT_S)
        except TimeoutError:
            return f"the {name} check did not answer within {CHECK_TIMEOUT_S:g} s"
        except Exception as exc:  # a check that breaks is a failing dependency, not a crash
            return f"the {name} check failed: {type(exc).__name__}: {exc}"

    async def check_now(self) -> bool:
        """Run every check once, update status, gauges and log; True when serving."""
        names = list(self._checks)
        results = await asyncio.gather(*(self._run_check(n, self._checks[n]) for n in names))
        for name, reason in zip(names, results, strict=True):
            if reason is None and name in self.failing:
                log.warning("health: %s recovered", name, extra={"condition": name})
                del self.failing[name]
            elif reason is not None and self.failing.get(name) != reason:
                log.warning("health: %s failing: %s", name, reason, extra={"condition": name})
                self.failing[name] = reason
            self.unhealthy.labels(condition=name).set(0 if reason is None else 1)
        if self.serving != self._published:
            self._published = self.serving
            status = SERVING if self.serving else NOT_SERVING
            for service_name in self._names:
                await self._servicer.set(service_name, status)
        return self.serving

    async def _loop(self) -> None:
        while True:
            await self.check_now()
            await asyncio.sleep(self._interval)

    def start(self) -> None:
        """Poll in the background until ``stop``."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="health-monitor")

    async def stop(self) -> None:
        """Stop polling (the caller then enters graceful shutdown)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
