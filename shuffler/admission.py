"""Admission on the shuffler's ports: devices' RPCs have a budget no stranger can spend (ADR 0032).

gRPC's own ``maximum_concurrent_rpcs`` counts every open stream from the moment its headers
arrive: health ``Watch`` streams, and calls whose request never finishes arriving, held the
slots and shed every device's ``GetCampaign`` and ``SubmitReports`` (issue 20, item 3). Here:

- ``Watch`` is served only to callers with a verified client certificate (the operator port);
  strangers get ``Check`` only (UNIMPLEMENTED names the alternative), and probes use the operator port;
- device RPCs take a slot of their own budget only once their request has fully arrived and
  give it back when they answer; every other RPC has a separate budget of the same size;
- a device RPC that runs past ``device_deadline_s`` is ended with DEADLINE_EXCEEDED, so slow
  work cannot keep its slot.

Over a budget the call gets RESOURCE_EXHAUSTED at once (and a metric), nothing spooled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc

WATCH_METHOD: Final = "/grpc.health.v1.Health/Watch"
DEFAULT_DEVICE_DEADLINE_S: Final = 30.0

Context = grpc.aio.ServicerContext[Any, Any]
Shed = Callable[[str, str], None]


class _Budget:
    """A non-blocking counting budget: a call either gets a slot now or is refused."""

    __slots__ = ("free", "name")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.free = size

    def take(self) -> bool:
        if self.free <= 0:
            return False
        self.free -= 1
        return True

    def give(self) -> None:
        self.free += 1


def has_client_certificate(context: Context) -> bool:
    """Whether the caller showed a certificate the server verified (the operator port requires one)."""
    return bool(context.auth_context().get("x509_pem_cert"))


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    """Separate budgets for device RPCs and the rest, a device deadline, Watch only with a certificate."""

    def __init__(
        self,
        device_methods: frozenset[str],
        budget: int,
        *,
        device_deadline_s: float = DEFAULT_DEVICE_DEADLINE_S,
        on_shed: Shed | None = None,
    ) -> None:
        """``budget`` slots for ``device_methods`` and as many for every other unary call."""
        if budget < 1 or not device_deadline_s > 0:
            raise ValueError("the admission budget must be >= 1 and the device deadline > 0")
        self._device_methods = device_methods
        self._device = _Budget("device", budget)
        self._other = _Budget("other", budget)
        self._deadline_s = device_deadline_s
        self._on_shed = on_shed or (lambda _rpc, _code: None)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        replace = getattr(handler, "_replace", None)  # grpc's RpcMethodHandler is a namedtuple
        if handler is None or replace is None:
            return handler
        method = details.method
        rpc = method.rsplit("/", 1)[-1]
        if method == WATCH_METHOD and handler.unary_stream is not None:
            return replace(unary_stream=self._watch(handler.unary_stream))  # type: ignore[no-any-return]
        if handler.unary_unary is None:
            return handler
        device = method in self._device_methods
        budget = self._device if device else self._other
        deadline = self._deadline_s if device else None
        return replace(  # type: ignore[no-any-return]
            unary_unary=self._admitted(handler.unary_unary, rpc, budget, deadline)
        )

    def _watch(self, behaviour: Any) -> Any:
        async def watch(request: Any, context: Context) -> Any:
            if not has_client_certificate(context):
                self._on_shed("Watch", "UNIMPLEMENTED")
                await context.abort(
                    grpc.StatusCode.UNIMPLEMENTED,
                    "health Watch is served on the operator port only; use Check here",
                )
            return await behaviour(request, context)

        return watch

    def _admitted(self, behaviour: Any, rpc: str, budget: _Budget, deadline: float | None) -> Any:
        async def admitted(request: Any, context: Context) -> Any:
            if not budget.take():
                self._on_shed(rpc, "RESOURCE_EXHAUSTED")
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the shuffler is at its {budget.name} RPC limit; retry with backoff",
                )
            try:
                if deadline is None:
                    return await behaviour(request, context)
                try:
                    return await asyncio.wait_for(behaviour(request, context), deadline)
                except TimeoutError:
                    self._on_shed(rpc, "DEADLINE_EXCEEDED")
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"{rpc} took longer than the shuffler's {deadline:g} s; retry",
                    )
            finally:
                budget.give()

        return admitted
