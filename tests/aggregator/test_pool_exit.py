"""A decrypt worker killed while a large batch is being fed to the pool must not stop the aggregator
from exiting (CPython gh-94777, unfixed before 3.11.5, Debian 12 ships 3.11.2; ADR 0046).

The scene, made deterministic: one worker is busy (a long sleep) and a 4 MiB work item waits in
the call pipe, so the pool's feeder thread is blocked writing it (the pipe holds 64 KiB). The
worker is SIGKILLed; the pool breaks. On an affected Python a plain ``ProcessPoolExecutor`` then
never exits (its manager joins the blocked feeder, and the interpreter joins the manager); ours
closes its end of the pipe first, as CPython 3.11.5 does, and exits. Both are run: the plain pool
shows the hang where the Python has the bug (the fresh-container run, scripts/test-in-container.sh)
and exits where it has not, so the test says which Python it proved the fix on.
"""

from __future__ import annotations

import subprocess
import sys

from deniable.aggregator.pool import FEEDER_FIX_NEEDED, spawn_pool

SCRIPT = """
import multiprocessing, os, signal, sys, time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from deniable.aggregator.pool import spawn_pool

if __name__ == "__main__":
    if sys.argv[1] == "ours":
        pool = spawn_pool(1)
    else:
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    busy = pool.submit(time.sleep, 60)
    waiting = pool.submit(len, b"x" * (4 << 20))  # blocks the feeder: no worker reads it
    time.sleep(1.0)
    for pid in list(pool._processes):
        os.kill(pid, signal.SIGKILL)
    try:
        waiting.result(timeout=30)
    except BrokenProcessPool:
        print("broken", flush=True)
    pool.shutdown(wait=False)
    print("exiting", flush=True)
"""
EXIT_TIMEOUT_S = 25.0  # the scene takes ~2 s; a hang is a hang


def _run(kind: str) -> tuple[bool, str]:
    """(exited in time, stdout) for one pool kind; a hung interpreter is killed."""
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, kind], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = process.communicate(timeout=EXIT_TIMEOUT_S)
        return True, out
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        return False, out


def test_our_pool_exits_after_a_worker_dies_while_a_batch_is_fed() -> None:
    exited, out = _run("ours")
    assert out.split() == ["broken", "exiting"]
    assert exited, f"Python {sys.version.split()[0]}: the aggregator's pool hung at exit"


def test_a_plain_pool_hangs_exactly_where_the_python_has_the_bug() -> None:
    """The protection removed: hangs on Python < 3.11.5, exits on fixed ones (where ours adds nothing)."""
    exited, out = _run("plain")
    assert out.split() == ["broken", "exiting"]  # the scene happened: the pool broke, main returned
    print(f"Python {sys.version.split()[0]}: plain pool {'exited' if exited else 'hung at exit'}")
    assert exited is not FEEDER_FIX_NEEDED


def test_the_fix_is_applied_only_where_needed() -> None:
    pool = spawn_pool(1)
    try:
        pool.submit(int).result(timeout=60)
        manager = pool._executor_manager_thread
        assert ("terminate_broken" in vars(manager)) is FEEDER_FIX_NEEDED
    finally:
        pool.shutdown()
