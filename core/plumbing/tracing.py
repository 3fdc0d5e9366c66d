"""Optional OpenTelemetry tracing of the gRPC server calls (the ``[otel]`` extra, off by default).

Privacy (ADR 0024): every server span is a new root trace (incoming ``traceparent`` is never read,
so a device cannot tag its reports to link them through the shuffler), nothing is injected into
outgoing calls, and the only attributes are the RPC's service, method and status code: never a
peer address, report id, request id or metadata. OpenTelemetry is imported only when asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.calls import code_name, stream_items, wrap_behaviour

EXTRA_HINT: Final = "tracing needs the otel extra: pip install 'deniable[otel]'"


def tracer_provider(service: str, endpoint: str | None = None, console: bool = False) -> Any:
    """A TracerProvider exporting to an OTLP/gRPC ``endpoint`` and/or the console; None if neither.

    Not installed globally: a shuffler and an aggregator in one process keep their own.
    """
    if endpoint is None and not console:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise ConfigurationError(EXTRA_HINT) from None
    provider = TracerProvider(resource=Resource.create({"service.name": f"deniable-{service}"}))
    if endpoint is not None:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigurationError(EXTRA_HINT) from None
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    if console:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    return provider


class TracingInterceptor(grpc.aio.ServerInterceptor):
    """One SERVER span per RPC, a new root each time; attributes: rpc.system/service/method/status code."""

    def __init__(self, provider: Any) -> None:
        """Spans go to ``provider`` (an opentelemetry TracerProvider)."""
        from opentelemetry import context, trace

        self._tracer = provider.get_tracer("deniable")
        self._trace = trace
        self._empty = context.Context()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        service, _, method = details.method.lstrip("/").rpartition("/")
        return wrap_behaviour(  # type: ignore[no-any-return]
            handler,
            lambda behaviour: self._unary(behaviour, service, method),
            lambda behaviour: self._streaming(behaviour, service, method),
        )

    def _start(self, service: str, method: str) -> Any:
        """A root span (empty parent context: incoming trace context is ignored by construction)."""
        return self._tracer.start_span(
            f"{service}/{method}",
            context=self._empty,
            kind=self._trace.SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
            record_exception=False,
            set_status_on_exception=False,
        )

    def _end(self, span: Any, context: Any, error: BaseException | None) -> None:
        """Record the status code (no message or exception text: they may quote a request) and end."""
        code = code_name(context, error)
        number = getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN).value[0]
        span.set_attribute("rpc.grpc.status_code", number)
        if code != "OK":
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end()

    def _unary(self, behaviour: Any, service: str, method: str) -> Any:
        async def traced(request: Any, context: Any) -> Any:
            span = self._start(service, method)
            error: BaseException | None = None
            try:
                with self._trace.use_span(span, end_on_exit=False, record_exception=False):
                    result = behaviour(request, context)
                    return (await result) if hasattr(result, "__await__") else result
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._end(span, context, error)

        return traced

    def _streaming(self, behaviour: Any, service: str, method: str) -> Any:
        async def traced(request: Any, context: Any) -> Any:
            span = self._start(service, method)
            error: BaseException | None = None
            try:
                with self._trace.use_span(span, end_on_exit=False, record_exception=False):
                    async for item in stream_items(behaviour(request, context)):
                        yield item
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._end(span, context, error)

        return traced


def internal_span(provider: Any, name: str, root: bool = False) -> contextlib.AbstractContextManager[Any]:
    """A context manager: an INTERNAL span ``name`` with no attributes, a child of the current span
    or (``root``) a new root trace."""
    from opentelemetry import context

    span: contextlib.AbstractContextManager[Any] = provider.get_tracer("deniable").start_as_current_span(
        name, context=context.Context() if root else None, record_exception=False
    )
    return span


def shutdown(provider: Any) -> None:
    """Flush and stop the provider's exporters (no-op if tracing is off)."""
    if provider is not None:
        provider.shutdown()
