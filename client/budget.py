"""Per-device privacy budget: how much local epsilon this device has spent, per campaign and overall.

Only local guarantees are booked as epsilon. Shuffle-only protocols (``local_privacy`` False) give a
report no local epsilon: their epsilon0 is a central target that holds only if the shuffler and
the aggregator do not collude, so they are recorded apart, as central-only participations
(``participate``), and never added to the local spend or the device-wide limit.

Composition is basic and sequential: the spend of a campaign is the sum of the epsilon0 of the
reports sent for it, and the device-wide spend is the sum over campaigns. Amounts are kept as
integers in micro-epsilon (1e-6) units, each rounded to the nearest unit, so ``0.1 + 0.2`` fits a
limit of ``0.3`` and an epsilon0 equal to its limit (``ln 3``, ``1/3``) always fits once; a charge
is never less than one unit. The recorded spend differs from the exact sum of the floats by less
than half a micro-epsilon per charge.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from pathlib import Path
from types import TracebackType
from typing import Final

from deniable.core.plumbing.sqlite import open_database

MICRO: Final = 1_000_000
_MAX_MICRO: Final = 1 << 53  # about 9e9 epsilon: saturating here keeps every sum inside SQLite's int64

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budget (
    campaign_id TEXT PRIMARY KEY,
    spent_micro INTEGER NOT NULL,
    limit_micro INTEGER NOT NULL,
    charges INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS participation (
    campaign_id TEXT PRIMARY KEY,
    reports INTEGER NOT NULL,
    central_target_micro INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS incarnation (
    campaign_id TEXT PRIMARY KEY,
    incarnation BLOB NOT NULL
);
"""


def to_micro(epsilon: float) -> int:
    """Epsilon in integer micro-epsilon units, rounded to nearest (saturating near 9e9 epsilon)."""
    if not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be a finite non-negative number, got {epsilon!r}")
    return min(round(epsilon * MICRO), _MAX_MICRO)


def _charge_micro(epsilon: float) -> int:
    if not epsilon > 0:
        raise ValueError(f"a charge must be positive, got {epsilon!r}")
    return max(1, to_micro(epsilon))


def fits(epsilon: float, limit: float) -> bool:
    """Whether one charge of ``epsilon`` fits an empty budget of ``limit`` (same units as the ledger)."""
    return _charge_micro(epsilon) <= to_micro(limit)


class BudgetExceeded(Exception):
    """A report would take this device past its privacy budget; nothing was charged."""

    def __init__(self, scope: str, spent: float, requested: float, limit: float) -> None:
        super().__init__(
            f"privacy budget exceeded for {scope}: spent {spent:g} + requested {requested:g} "
            f"> limit {limit:g} (epsilon)"
        )
        self.scope = scope
        self.spent = spent
        self.requested = requested
        self.limit = limit


class IncarnationMismatch(Exception):
    """A description of a campaign id in another incarnation than the one this device pinned."""


class BudgetLedger:
    """Durable per-campaign and device-wide epsilon spend (SQLite file, or in memory when None)."""

    def __init__(self, path: Path | str | None = None, total_limit: float | None = None) -> None:
        """Open the ledger; ``total_limit`` caps the sum of spend over all campaigns if given."""
        path = None if path is None else Path(path)
        if path is None:
            self._db: sqlite3.Connection | None = sqlite3.connect(
                ":memory:", isolation_level=None, check_same_thread=False
            )
        else:
            self._db = open_database(path)
        self.path = path
        self.total_limit = total_limit
        self._total_limit_micro = None if total_limit is None else to_micro(total_limit)
        self._lock = threading.Lock()
        self._db.executescript(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("budget ledger is closed")
        return self._db

    def charge(self, campaign_id: str, epsilon: float, limit: float) -> None:
        """Record ``epsilon`` spent on ``campaign_id`` durably, or raise BudgetExceeded and charge nothing.

        ``limit`` is the campaign's ``device_budget_epsilon``; the device-wide ``total_limit``
        applies as well.
        """
        amount = _charge_micro(epsilon)
        limit_micro = to_micro(limit)
        with self._lock:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT spent_micro FROM budget WHERE campaign_id = ?", (campaign_id,)
                ).fetchone()
                spent = int(row[0]) if row else 0
                if spent + amount > limit_micro:
                    raise BudgetExceeded(f"campaign {campaign_id!r}", spent / MICRO, epsilon, limit)
                if self._total_limit_micro is not None:
                    total = int(db.execute("SELECT COALESCE(SUM(spent_micro), 0) FROM budget").fetchone()[0])
                    if total + amount > self._total_limit_micro:
                        raise BudgetExceeded(
                            "this device", total / MICRO, epsilon, self._total_limit_micro / MICRO
                        )
                db.execute(
                    "INSERT INTO budget (campaign_id, spent_micro, limit_micro, charges) VALUES (?, ?, ?, 1) "
                    "ON CONFLICT (campaign_id) DO UPDATE SET "
                    "spent_micro = spent_micro + excluded.spent_micro, "
                    "limit_micro = excluded.limit_micro, charges = charges + 1",
                    (campaign_id, amount, limit_micro),
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def participate(self, campaign_id: str, central_target: float, limit: int) -> None:
        """Record one report to a shuffle-only campaign (no local epsilon), or raise BudgetExceeded
        when it would be the campaign's ``limit``-plus-first; ``central_target`` is kept for display."""
        target = to_micro(central_target)
        with self._lock:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT reports FROM participation WHERE campaign_id = ?", (campaign_id,)
                ).fetchone()
                done = int(row[0]) if row else 0
                if done + 1 > limit:
                    raise BudgetExceeded(f"campaign {campaign_id!r} (central-only reports)", done, 1, limit)
                db.execute(
                    "INSERT INTO participation (campaign_id, reports, central_target_micro) VALUES (?, 1, ?) "
                    "ON CONFLICT (campaign_id) DO UPDATE SET reports = reports + 1, "
                    "central_target_micro = excluded.central_target_micro",
                    (campaign_id, target),
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def pin_incarnation(self, campaign_id: str, incarnation: bytes) -> None:
        """Pin the first incarnation seen for ``campaign_id``; IncarnationMismatch for another one.

        Campaign ids are never reused, so another incarnation is an older (deleted) life of the id
        replayed to this device, or a forgery: either way nothing is sent under it. Descriptions
        without an incarnation (made before they existed) are neither pinned nor refused.
        """
        if not incarnation:
            return
        with self._lock:
            db = self._conn()
            db.execute(
                "INSERT INTO incarnation (campaign_id, incarnation) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (campaign_id, bytes(incarnation)),
            )
            (pinned,) = db.execute(
                "SELECT incarnation FROM incarnation WHERE campaign_id = ?", (campaign_id,)
            ).fetchone()
        if bytes(pinned) != bytes(incarnation):
            raise IncarnationMismatch(
                f"campaign {campaign_id!r}: this description belongs to another incarnation of the id"
                f" ({bytes(incarnation).hex()[:8]}…) than the one this device pinned"
                f" ({bytes(pinned).hex()[:8]}…); refusing it"
            )

    def participations(self, campaign_id: str | None = None) -> int:
        """Reports sent to shuffle-only campaigns (one campaign, or all): central-only, no local epsilon."""
        with self._lock:
            db = self._conn()
            if campaign_id is None:
                row = db.execute("SELECT COALESCE(SUM(reports), 0) FROM participation").fetchone()
            else:
                row = db.execute(
                    "SELECT COALESCE(SUM(reports), 0) FROM participation WHERE campaign_id = ?",
                    (campaign_id,),
                ).fetchone()
        return int(row[0])

    def spent(self, campaign_id: str | None = None) -> float:
        """Local epsilon spent on one campaign, or on all of them when ``campaign_id`` is None."""
        with self._lock:
            db = self._conn()
            if campaign_id is None:
                row = db.execute("SELECT COALESCE(SUM(spent_micro), 0) FROM budget").fetchone()
            else:
                row = db.execute(
                    "SELECT COALESCE(SUM(spent_micro), 0) FROM budget WHERE campaign_id = ?", (campaign_id,)
                ).fetchone()
        return int(row[0]) / MICRO

    def close(self) -> None:
        """Close the database; further use raises RuntimeError."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> BudgetLedger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
