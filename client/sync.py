"""A blocking facade over ``Reporter`` for apps without an event loop (scripts, GUI threads, CLIs).

It runs the same Reporter (same outbox, budget ledger, backoff and retries) on a private event
loop owned by this object, so no asyncio knowledge is needed. Do not call it from inside a
running event loop: use ``Reporter`` there.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from deniable.client.budget import BudgetLedger
from deniable.client.outbox import Outbox
from deniable.client.reporter import Reporter, SendResult
from deniable.client.transport import Transport

T = TypeVar("T")


class SyncReporter:
    """Blocking ``fetch``/``record``/``send_pending``/``close``; one private loop, one call at a time."""

    def __init__(self, reporter: Reporter, loop: asyncio.AbstractEventLoop) -> None:
        """Wrap a Reporter made on ``loop`` (use ``SyncReporter.fetch``); the loop is ours to close."""
        self.reporter = reporter
        self._loop = loop
        self._lock = threading.Lock()

    @classmethod
    def fetch(
        cls,
        campaign_id: str,
        transport: Transport,
        outbox: Outbox,
        ledger: BudgetLedger | None = None,
        **fetch_options: Any,
    ) -> SyncReporter:
        """``Reporter.fetch`` (same retries and checks), blocking; ``fetch_options`` pass through."""
        loop = _new_loop()
        try:
            reporter = loop.run_until_complete(
                Reporter.fetch(campaign_id, transport, outbox, ledger, **fetch_options)
            )
        except BaseException:
            loop.run_until_complete(transport.close())
            loop.close()
            raise
        return cls(reporter, loop)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run one coroutine to completion on the private loop (calls from threads are serialised)."""
        with self._lock:
            if self._loop.is_closed():
                coroutine.close()
                raise RuntimeError("this SyncReporter is closed")
            return self._loop.run_until_complete(coroutine)

    def record(self, value: int) -> bytes:
        """``Reporter.record``: randomise, seal and queue one answer (charges the budget)."""
        with self._lock:
            return self.reporter.record(value)

    def send_pending(self, **options: Any) -> SendResult:
        """``Reporter.send_pending``, blocking (same batching, backoff and retry limits)."""
        return self._run(self.reporter.send_pending(**options))

    def close(self) -> None:
        """Close the transport and the private loop; the outbox and ledger stay the caller's."""
        if self._loop.is_closed():
            return
        self._run(self.reporter.transport.close())
        with self._lock:
            self._loop.close()

    def __enter__(self) -> SyncReporter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    """A fresh loop; refuses to run inside a running one (that would deadlock or raise later)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.new_event_loop()
    raise RuntimeError("SyncReporter cannot be used inside a running event loop: use Reporter there")
