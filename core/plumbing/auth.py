"""Who may call which RPC: a per-method allow-list checked by a server interceptor, default deny.

A method not in the policy needs the policy's ``default`` roles (the service's own operator role:
``aggregator-operator`` or ``shuffler-operator``), so an RPC added later is closed until it is
listed. Refusals end the call with UNAUTHENTICATED (no certificate, one without a role, one naming
the removed ``operator`` role, or a role issued by another party's CA) or PERMISSION_DENIED (the
wrong role) and count in ``deniable_auth_refusals_total``. With
``open_all`` (``--insecure``, tests only) nothing is checked.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import grpc
from cryptography import x509
from prometheus_client import Counter

from deniable.core.plumbing.tls import (
    NO_CERTIFICATE,
    NO_ROLE,
    RETIRED_ROLE,
    RETIRED_ROLES,
    WRONG_ISSUER,
    PeerRoles,
)

log = logging.getLogger("deniable.auth")

ANYONE: Final = frozenset({"*"})
"""Allowed with or without a certificate (device RPCs, health)."""
AGGREGATOR_OPERATOR: Final = frozenset({"aggregator-operator"})
SHUFFLER_OPERATOR: Final = frozenset({"shuffler-operator"})
HEALTH_METHODS: Final = ("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch")

Context = grpc.aio.ServicerContext[Any, Any]
_MESSAGES: Final = {
    "no_certificate": "this RPC needs a client certificate",
    "no_role": "the client certificate names no deniable role",
    "retired_role": RETIRED_ROLES["operator"],
    "wrong_issuer": "the client certificate's role was not issued by the CA of that role's party",
}
_UNAUTHENTICATED: Final = {
    NO_CERTIFICATE: "no_certificate",
    NO_ROLE: "no_role",
    RETIRED_ROLE: "retired_role",
    WRONG_ISSUER: "wrong_issuer",
}


@dataclass(frozen=True)
class AccessPolicy:
    """Roles allowed per full method name (``/pkg.Service/Method``); others need ``default``."""

    service: str
    allowed: Mapping[str, frozenset[str]]
    default: frozenset[str]

    def roles_for(self, method: str) -> frozenset[str]:
        """The roles that may call ``method``."""
        return self.allowed.get(method, self.default)


def refusal(policy: AccessPolicy, method: str, role: str) -> tuple[grpc.StatusCode, str] | None:
    """Why ``role`` may not call ``method`` (status, reason label), or None when it may."""
    roles = policy.roles_for(method)
    if roles is ANYONE or "*" in roles:
        return None
    if role in _UNAUTHENTICATED:
        return grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED[role]
    if role not in roles:
        return grpc.StatusCode.PERMISSION_DENIED, "wrong_role"
    return None


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call against an ``AccessPolicy`` before the servicer sees it."""

    def __init__(
        self,
        policy: AccessPolicy,
        refusals: Counter,
        issuers: Mapping[str, tuple[x509.Certificate, ...]] | None = None,
        *,
        open_all: bool = False,
    ) -> None:
        """``refusals``: a counter labelled service, rpc, reason; ``issuers``: each party's CAs
        (``ServerTls.issuers``; a role counts only from its own party's CA); ``open_all``:
        insecure test mode."""
        self._policy = policy
        self._refusals = refusals
        self._open_all = open_all
        self._roles = PeerRoles(issuers or {})

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or self._open_all or "*" in self._policy.roles_for(method):
            return handler
        return _guarded(handler, lambda context: self._check(method, context))

    async def _check(self, method: str, context: Context) -> None:
        verdict = refusal(self._policy, method, self._roles.role(context))
        if verdict is None:
            return
        code, reason = verdict
        rpc = method.rsplit("/", 1)[-1]
        self._refusals.labels(service=self._policy.service, rpc=rpc, reason=reason).inc()
        roles = " or ".join(sorted(self._policy.roles_for(method)))
        await context.abort(code, _MESSAGES.get(reason, f"this RPC needs the {roles} role"))


def _guarded(
    handler: grpc.RpcMethodHandler[Any, Any], check: Callable[[Context], Awaitable[None]]
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with ``check`` run first (it aborts the call to refuse it)."""
    replace = handler._replace  # type: ignore[attr-defined]  # grpc's RpcMethodHandler is a namedtuple
    if handler.unary_unary is not None:
        return replace(unary_unary=_unary(handler.unary_unary, check))  # type: ignore[no-any-return]
    if handler.stream_unary is not None:
        return replace(stream_unary=_unary(handler.stream_unary, check))  # type: ignore[no-any-return]
    if handler.unary_stream is not None:
        return replace(unary_stream=_streaming(handler.unary_stream, check))  # type: ignore[no-any-return]
    return replace(stream_stream=_streaming(handler.stream_stream, check))  # type: ignore[no-any-return]


def _unary(behaviour: Any, check: Callable[[Context], Awaitable[None]]) -> Any:
    async def guarded(request: Any, context: Context) -> Any:
        await check(context)
        result = behaviour(request, context)
        return (await result) if inspect.isawaitable(result) else result

    return guarded


def _streaming(behaviour: Any, check: Callable[[Context], Awaitable[None]]) -> Any:
    async def guarded(request: Any, context: Context) -> AsyncIterator[Any]:
        await check(context)
        result = behaviour(request, context)
        if hasattr(result, "__aiter__"):
            async for item in result:
                yield item
        elif inspect.isawaitable(result):
            await result
        else:
            for item in result:
                yield item

    return guarded


def warn_open(service: str) -> None:
    """Log, loudly, that a service runs without TLS and with every RPC open to anyone."""
    log.warning(
        "INSECURE: %s serves plaintext and checks no credentials: every RPC, operator ones"
        " included, is open to anyone who can reach the port (for tests only)",
        service,
    )
