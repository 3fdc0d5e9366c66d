"""The decrypt worker pool: spawned processes that die with the aggregator, rebuilt when one dies.

A worker killed mid-batch (the OOM killer, an operator) breaks a ``ProcessPoolExecutor`` for good;
``DecryptPool.heal`` replaces it and the handler retries the batch, which was never acknowledged
(batches are idempotent). While a rebuild keeps failing, ``check`` reports why (health NOT_SERVING)
and tries again, so the service recovers by itself.

On Python before 3.11.5 (Debian 12's is 3.11.2) a worker killed while the pool's feeder thread is
writing a large batch into the call pipe leaves that thread blocked for ever, and with it the
interpreter's exit: ``PipeSafeProcessPool`` carries CPython's own fix (gh-94777, ADR 0046).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, Final

from prometheus_client import Counter

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.process import die_with_parent

WARM_UP_TIMEOUT_S: Final = 60.0
log = logging.getLogger("deniable.aggregator")


class PoolUnavailable(Exception):
    """The decrypt workers cannot be (re)started now; the batch is not counted and will be resent."""


FEEDER_FIX_NEEDED: Final = sys.version_info < (3, 11, 5)
"""CPython gh-94777 (a broken pool's exit blocks on its call-queue feeder) is fixed from 3.11.5."""


class PipeSafeProcessPool(ProcessPoolExecutor):
    """A ``ProcessPoolExecutor`` whose breakdown cannot block its feeder thread (so exit) for ever.

    When a worker dies, the pool's manager thread terminates the others and joins the call queue's
    feeder thread. If that thread is blocked writing a work item into the pipe nobody reads any
    more, the join never returns, and neither does the interpreter's exit, which joins the manager.
    CPython 3.11.5 closes the parent's read end of that pipe first (gh-94777): the blocked write
    then fails with EPIPE and the feeder ends. This does the same on older Pythons.
    """

    def _start_executor_manager_thread(self) -> None:
        super()._start_executor_manager_thread()
        # Set on the running thread: only a worker dying in the microseconds before this line,
        # while it still boots, would meet the unpatched method.
        manager: Any = self._executor_manager_thread
        if FEEDER_FIX_NEEDED and "terminate_broken" not in vars(manager):
            manager.terminate_broken = _closing_call_pipe_first(manager)


def _closing_call_pipe_first(manager: Any) -> Callable[[Any], None]:
    """The manager's ``terminate_broken`` preceded by closing our end of the call pipe (gh-94777):
    run in the manager thread, as upstream's fix is; the read end is ours only, never a worker's."""
    original = manager.terminate_broken

    def terminate_broken(cause: Any) -> None:
        manager.call_queue._reader.close()
        original(cause)

    return terminate_broken


def spawn_pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` spawned processes (never forked from a process running gRPC) that die with us."""
    return PipeSafeProcessPool(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )


class DecryptPool:
    """A process pool that is replaced, not hidden, when a worker dies."""

    def __init__(
        self,
        workers: int,
        rebuilds: Counter,
        factory: Callable[[int], Executor] = spawn_pool,
    ) -> None:
        """Start ``workers`` processes; ``rebuilds`` counts replacements (a Prometheus counter)."""
        if workers < 1:
            raise ConfigurationError(f"a decrypt pool needs at least 1 worker, got {workers}")
        self.workers = workers
        self._factory = factory
        self._rebuilds = rebuilds
        self._lock = asyncio.Lock()
        self.executor: Executor = factory(workers)
        self.broken: str | None = None
        """Why the last rebuild failed (None while the pool works)."""

    async def warm_up(self) -> None:
        """Start every worker now (a pool starts them lazily) and prove they run."""
        loop = asyncio.get_running_loop()
        work = [loop.run_in_executor(self.executor, os.getpid) for _ in range(self.workers)]
        await asyncio.wait_for(asyncio.gather(*work), WARM_UP_TIMEOUT_S)

    async def heal(self, failed: Executor) -> None:
        """Replace ``failed`` (if no one did already) and prove the new workers start; PoolUnavailable."""
        async with self._lock:
            if failed is not self.executor and self.broken is None:
                return  # a concurrent batch rebuilt it already
            failed.shutdown(wait=False, cancel_futures=True)
            try:
                fresh = self._factory(self.workers)
                loop = asyncio.get_running_loop()
                await asyncio.wait_for(loop.run_in_executor(fresh, os.getpid), WARM_UP_TIMEOUT_S)
            except Exception as exc:
                self.broken = f"decrypt workers cannot be restarted: {type(exc).__name__}: {exc}"
                log.error("%s", self.broken)
                raise PoolUnavailable(self.broken) from exc
            self.executor = fresh
            self._rebuilds.inc()
            if self.broken is not None:
                log.warning("decrypt workers restarted after: %s", self.broken)
            else:
                log.warning("a decrypt worker died; the pool was rebuilt and the batch is retried")
            self.broken = None

    async def check(self) -> str | None:
        """Health: None while the pool works; a pool that lost a worker while idle, or that could
        not be rebuilt, is rebuilt first (so the next batch does not pay for it)."""
        idle_break = bool(getattr(self.executor, "_broken", False))  # set by the pool's own monitor
        if self.broken is not None or idle_break:
            try:
                await self.heal(self.executor)
            except PoolUnavailable:
                return self.broken
        return None

    def shutdown(self) -> None:
        """Stop the workers (cancels queued work)."""
        self.executor.shutdown(wait=True, cancel_futures=True)
