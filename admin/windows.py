"""``--window`` values: a duration (``90m``, ``2h``, ``7d``) or an ISO 8601 end time."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION: Final = re.compile(r"(\d+)([smhdw])")


def parse_window(text: str, now_unix: float) -> tuple[int, int]:
    """(window_s, window_end_unix): one of them set, the other 0; ValueError with one line if neither.

    A duration counts from the campaign's creation; an end time without a zone is UTC.
    """
    value = text.strip().lower()
    match = _DURATION.fullmatch(value)
    if match is not None:
        seconds = int(match.group(1)) * _UNITS[match.group(2)]
        if seconds <= 0:
            raise ValueError(f"--window must be positive, got {text!r}")
        return seconds, 0
    try:
        end = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--window takes a duration (e.g. 90m, 2h, 7d) or an ISO 8601 end time, got {text!r}"
        ) from None
    if end.tzinfo is None:
        end = end.replace(tzinfo=UTC)
    end_unix = int(end.timestamp())
    if end_unix <= now_unix:
        raise ValueError(f"--window end {text!r} is in the past")
    return 0, end_unix
