"""What a server interceptor needs to know about a call: its final status and its streamed items.

Shared by the metrics and tracing interceptors (core/plumbing/metrics.py, core/plumbing/tracing.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc


async def stream_items(result: Any) -> AsyncIterator[Any]:
    """The items of a streaming handler's result, whichever form it took (async generator,
    coroutine writing through the context, or plain iterable): shared by the metrics and tracing
    interceptors."""
    if hasattr(result, "__aiter__"):
        async for item in result:
            yield item
    elif hasattr(result, "__await__"):
        await result
    else:
        for item in result:
            yield item


def code_name(context: Any, error: BaseException | None) -> str:
    """The status the call ends with: what the handler set or aborted with, else OK / CANCELLED / UNKNOWN."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int) and code:
        return next((c.name for c in grpc.StatusCode if c.value[0] == code), "UNKNOWN")
    if error is None or isinstance(error, GeneratorExit):
        return "OK"
    if isinstance(error, asyncio.CancelledError):
        return "CANCELLED"
    return "UNKNOWN"


Wrap = Callable[[Any], Any]
"""Takes a handler's behaviour (``behaviour(request, context)``) and returns the wrapped one."""


def wrap_behaviour(handler: Any, unary: Wrap, streaming: Wrap) -> Any:
    """``handler`` with its behaviour wrapped by ``unary`` (one response) or ``streaming`` (a response
    stream); returned as is when it is None or not grpc's namedtuple ``RpcMethodHandler``."""
    replace = getattr(handler, "_replace", None)
    if handler is None or replace is None:
        return handler
    for kind in ("unary_unary", "stream_unary"):
        if (behaviour := getattr(handler, kind)) is not None:
            return replace(**{kind: unary(behaviour)})
    for kind in ("unary_stream", "stream_stream"):
        if (behaviour := getattr(handler, kind)) is not None:
            return replace(**{kind: streaming(behaviour)})
    return handler
