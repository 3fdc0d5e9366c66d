"""A settable wall clock for handlers and services that take ``clock=`` (retention, windows, expiry)."""

from __future__ import annotations


class Clock:
    """Returns ``now`` when called; tests move time by setting ``now``."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
