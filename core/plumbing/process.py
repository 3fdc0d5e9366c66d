"""Child processes that die with their parent, however the parent dies.

``die_with_parent`` runs first in every worker a service starts (a ``ProcessPoolExecutor``
initializer, a planning process): Linux ``PR_SET_PDEATHSIG`` kills the worker as soon as its parent
exits, and a watcher thread polling the parent id covers the cases the signal misses (another OS,
a parent thread that exited before the parent).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Final, TypeVar

T = TypeVar("T")
PR_SET_PDEATHSIG: Final = 1
WATCH_INTERVAL_S: Final = 0.2


def _set_pdeathsig(sig: int) -> bool:
    """Ask the Linux kernel to send ``sig`` when the parent exits; False where unsupported."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)) == 0
    return False


def _watch_parent(parent: int, interval: float) -> None:
    """Exit the process at once when it is re-parented (its parent has died)."""
    while os.getppid() == parent:
        time.sleep(interval)
    os._exit(1)


def die_with_parent(parent: int | None = None, interval: float = WATCH_INTERVAL_S) -> None:
    """Make this (child) process exit when ``parent`` (default: the current parent) dies."""
    expected = os.getppid() if parent is None else parent
    _set_pdeathsig(signal.SIGKILL)
    if os.getppid() != expected:  # the parent died before the signal was armed
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(expected, interval), daemon=True).start()


class ChildDied(Exception):
    """The child process running a computation died before answering."""


def _child_main(send: Connection, parent: int, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    die_with_parent(parent)
    try:
        outcome: tuple[str, Any] = ("ok", function(*args))
    except Exception as exc:  # handed to the parent, which re-raises it
        outcome = ("error", exc)
    send.send(outcome)
    send.close()


async def run_in_child(function: Callable[..., T], *args: Any, timeout: float | None) -> T:
    """``function(*args)`` in a spawned process that is killed when the caller is cancelled or
    ``timeout`` passes (TimeoutError): a long computation never outlives its request or service."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(send, os.getpid(), function, args), daemon=True)
    child.start()
    send.close()
    try:
        status, value = await asyncio.wait_for(asyncio.to_thread(receive.recv), timeout)
    except EOFError:
        raise ChildDied(f"the process computing {getattr(function, '__name__', 'it')} died") from None
    finally:
        if child.is_alive():
            child.kill()
        await asyncio.to_thread(child.join, 5)
        receive.close()
    if status == "error":
        raise value
    return value  # type: ignore[no-any-return]
