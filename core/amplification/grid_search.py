"""Searches over the 2**-52 probability grid for the smallest noise meeting a privacy target.

Every shuffle-only protocol picks its noise the same way (written once here, ADR 0027): ``meets``
is monotone (more noise never hurts privacy), and the answer is the smallest grid numerator that
meets the target, to 1/128 relative, always one that was checked.
"""

from __future__ import annotations

from collections.abc import Callable

Meets = Callable[[int], bool]


def dyadic_bracket(meets: Meets, top_exponent: int) -> tuple[int, int]:
    """(lo, hi) with meets(hi) and not meets(lo), both powers of two, given meets(2**top_exponent);
    (0, 1) when the smallest numerator 1 already meets the target."""
    if meets(1):
        return 0, 1
    lo_e, hi_e = 0, top_exponent
    while hi_e - lo_e > 1:
        mid = (lo_e + hi_e) // 2
        if meets(1 << mid):
            hi_e = mid
        else:
            lo_e = mid
    return 1 << lo_e, 1 << hi_e


def climb_until_met(meets: Meets, start: int, cap: int) -> int | None:
    """The first numerator from ``start`` upwards (steps of 1/64 relative) that meets the target;
    None when even ``cap`` does not."""
    hi = start
    while not meets(hi):
        if hi >= cap:
            return None
        hi = min(cap, hi + max(1, hi >> 6))
    return hi


def smallest_meeting(meets: Meets, lo: int, hi: int) -> int:
    """Smallest numerator in (lo, hi] meeting the target, to 1/128 relative, by bisection;
    not meets(lo) and meets(hi) on entry."""
    while hi - lo > max(1, hi >> 7):
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi
