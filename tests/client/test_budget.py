"""BudgetLedger: per-campaign and device-wide epsilon spend, durable, exact in micro-epsilon units."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from deniable.client.budget import BudgetExceeded, BudgetLedger, fits, to_micro


def test_charges_up_to_the_limit() -> None:
    ledger = BudgetLedger(None)
    ledger.charge("a", 0.5, 1.0)
    ledger.charge("a", 0.5, 1.0)
    with pytest.raises(BudgetExceeded) as info:
        ledger.charge("a", 0.5, 1.0)
    assert "spent 1 + requested 0.5 > limit 1" in str(info.value)
    assert (info.value.spent, info.value.requested, info.value.limit) == (1.0, 0.5, 1.0)
    assert ledger.spent("a") == 1.0 and ledger.spent("b") == 0.0 and ledger.spent() == 1.0


@pytest.mark.parametrize(
    ("epsilon", "limit", "times"), [(0.1, 0.3, 3), (0.7, 2.1, 3), (math.log(3), math.log(3), 1)]
)
def test_float_rounding_does_not_refuse_or_overspend(epsilon: float, limit: float, times: int) -> None:
    ledger = BudgetLedger(None)
    for _ in range(times):
        ledger.charge("a", epsilon, limit)
    with pytest.raises(BudgetExceeded):
        ledger.charge("a", epsilon, limit)
    assert fits(epsilon, limit)


def test_device_wide_limit_composes_campaigns() -> None:
    ledger = BudgetLedger(None, total_limit=2.0)
    ledger.charge("a", 1.0, 1.0)
    ledger.charge("b", 0.6, 5.0)
    with pytest.raises(BudgetExceeded, match="this device"):
        ledger.charge("c", 0.5, 5.0)
    ledger.charge("c", 0.4, 5.0)
    assert ledger.spent() == pytest.approx(2.0)


def test_refused_charge_changes_nothing() -> None:
    ledger = BudgetLedger(None)
    with pytest.raises(BudgetExceeded):
        ledger.charge("a", 2.0, 1.0)
    assert ledger.spent() == 0.0


def test_persists_across_ledgers(tmp_path: Path) -> None:
    with BudgetLedger(tmp_path / "b.db") as ledger:
        ledger.charge("a", 0.75, 1.0)
    with BudgetLedger(tmp_path / "b.db") as ledger:
        assert ledger.spent("a") == 0.75
        with pytest.raises(BudgetExceeded):
            ledger.charge("a", 0.5, 1.0)


def test_tiny_charges_still_count_and_bad_values_are_refused() -> None:
    ledger = BudgetLedger(None)
    ledger.charge("a", 1e-9, 1.0)
    assert ledger.spent("a") == 1e-6
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            ledger.charge("a", bad, 1.0)
    assert to_micro(0.3) == 300_000


def test_huge_limits_do_not_overflow() -> None:
    ledger = BudgetLedger(None, total_limit=1e300)
    ledger.charge("a", 1.0, 1e300)
    ledger.charge("b", 1e9, 1e300)
    assert ledger.spent("a") == 1.0
