"""Exact (rational) laws of shuffled split-and-mix shares, for brute-force checks at tiny sizes.

The law of the shuffled multiset of shares (a count vector over Z_q) is the convolution of the
devices' exact share laws; the ideal is n m uniform values conditioned on the same sum.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

Law = dict[tuple[int, ...], Fraction]


def share_law(v: int, m: int, q: int) -> Law:
    """Exact law of the count vector of one device's m uniform shares summing to v mod q."""
    law: Law = {}
    weight = Fraction(1, q ** (m - 1))
    for free in itertools.product(range(q), repeat=m - 1):
        counts = Counter([*free, (v - sum(free)) % q])
        key = tuple(counts.get(j, 0) for j in range(q))
        law[key] = law.get(key, Fraction(0)) + weight
    return law


def convolve(a: Law, b: Law) -> Law:
    out: Law = {}
    for ka, pa in a.items():
        for kb, pb_ in b.items():
            key = tuple(x + y for x, y in zip(ka, kb, strict=True))
            out[key] = out.get(key, Fraction(0)) + pa * pb_
    return out


def mixture(parts: list[tuple[Fraction, Law]]) -> Law:
    out: Law = {}
    for weight, law in parts:
        for key, p in law.items():
            out[key] = out.get(key, Fraction(0)) + weight * p
    return out


def uniform_shares(total: int, s: int, q: int) -> Law:
    """Count-vector law of `total` uniform values in Z_q conditioned on their sum being s mod q."""
    law: Law = {}
    for cut in itertools.combinations(range(total + q - 1), q - 1):
        bounds = (-1, *cut, total + q - 1)
        counts = tuple(bounds[i + 1] - bounds[i] - 1 for i in range(q))
        if sum(j * c for j, c in enumerate(counts)) % q == s % q:
            ways = math.factorial(total) // math.prod(math.factorial(c) for c in counts)
            law[counts] = Fraction(ways, q ** (total - 1))
    return law


def tv(a: Law, b: Law) -> Fraction:
    keys = set(a) | set(b)
    return sum((abs(a.get(k, Fraction(0)) - b.get(k, Fraction(0))) for k in keys), Fraction(0)) / 2


def hockey(a: Law, b: Law, factor: Fraction) -> Fraction:
    return sum((max(Fraction(0), p - factor * b.get(k, Fraction(0))) for k, p in a.items()), Fraction(0))


def exact_share_distance(n: int, m: int, q: int) -> Fraction:
    """max over input vectors v of TV(shuffled shares of v, uniform shares with the same sum)."""
    laws = {v: share_law(v, m, q) for v in range(q)}
    worst = Fraction(0)
    for values in itertools.combinations_with_replacement(range(q), n):
        joint = laws[values[0]]
        for v in values[1:]:
            joint = convolve(joint, laws[v])
        worst = max(worst, tv(joint, uniform_shares(n * m, sum(values), q)))
    return worst


def noise_law(p: Fraction) -> dict[int, Fraction]:
    return {-1: p * (1 - p), 0: p * p + (1 - p) * (1 - p), 1: p * (1 - p)}


def view_law(bits: tuple[int, ...], p: Fraction, m: int, q: int) -> Law:
    """Exact law of the whole shuffled view (share count vector; presence count is constant)."""
    joint: Law | None = None
    for x in bits:
        device = mixture([(w, share_law((x + z) % q, m, q)) for z, w in noise_law(p).items()])
        joint = device if joint is None else convolve(joint, device)
    assert joint is not None
    return joint
