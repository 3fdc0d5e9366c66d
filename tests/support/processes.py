"""Ports and processes for tests that start real services: a free loopback port, a process tree."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A loopback port nobody listens on right now (the OS picks it; a race is possible but rare)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """Return once something accepts on loopback ``port``; AssertionError if ``proc`` exits first
    (with its stderr, when piped) or nothing listens within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            errors = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"service exited early ({proc.returncode}): {errors!s}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listened on port {port}")


def children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (from /proc), so a test can check that none outlives a kill."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo.extend(kids - found)
            found |= kids
    return found


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
