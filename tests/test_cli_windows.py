"""``--window``: durations and ISO end times, one-line errors for anything else."""

from __future__ import annotations

import pytest

from deniable.admin.windows import parse_window

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("text", "seconds"), [("90m", 5400), ("2h", 7200), ("7d", 604800), ("1w", 604800)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_window(text, NOW) == (seconds, 0)


def test_iso_end_time_is_utc_without_a_zone() -> None:
    assert parse_window("2027-01-15T12:00:00", NOW) == (0, 1_800_014_400)
    assert parse_window("2027-01-15T13:00:00+01:00", NOW) == (0, 1_800_014_400)


@pytest.mark.parametrize("text", ["soon", "0h", "2027-01-01", "-5m", "2h30"])
def test_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--window"):
        parse_window(text, NOW)
