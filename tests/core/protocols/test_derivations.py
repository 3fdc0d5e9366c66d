"""The intermediate steps of our own derivations, checked exactly at small sizes (issue 9 item 7).

Sample and threshold (docs/mechanisms/sample_and_threshold.md, "Theorem"): the losing bucket is
pure ln(1/(1-s))-DP, and the product step D_{e^(a+b)}(P1 x P2 || Q1 x Q2) <= D_{e^a}(P1 || Q1)
when P2 <= e^b Q2. Split and mix (docs/mechanisms/multi_message_sum_binomial.md, "Theorem"):
E[q^(C-1)] <= Phi(n) for the components C of two random partitions, by full enumeration.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest


def binomial_law(m: int, s: Fraction) -> list[Fraction]:
    return [math.comb(m, k) * s**k * (1 - s) ** (m - k) for k in range(m + 1)]


def released(m: int, s: Fraction, tau: int) -> dict[int, Fraction]:
    """Law of one bucket's release: its sampled count, or 0 (suppressed) at or below tau."""
    law: dict[int, Fraction] = {}
    for k, prob in enumerate(binomial_law(m, s)):
        key = k if k > tau else 0
        law[key] = law.get(key, Fraction(0)) + prob
    return law


@pytest.mark.parametrize(("s", "tau"), [(Fraction(1, 10), 2), (Fraction(1, 2), 3), (Fraction(3, 4), 1)])
def test_losing_bucket_is_pure_ln_one_over_one_minus_s(s: Fraction, tau: int) -> None:
    bound = 1 / (1 - s)
    worst = Fraction(0)
    for m in range(0, 14):
        fewer, more = released(m, s, tau), released(m + 1, s, tau)
        for output, prob in fewer.items():
            ratio = prob / more[output]
            assert ratio <= bound
            worst = max(worst, ratio)
    assert worst > Fraction(3, 4) * bound  # approached as m grows ((m - tau)/((m + 1)(1 - s))): tight


def hockey(p: dict[object, Fraction], q: dict[object, Fraction], e: Fraction) -> Fraction:
    return sum(
        (max(p.get(x, Fraction(0)) - e * q.get(x, Fraction(0)), Fraction(0)) for x in set(p) | set(q)),
        Fraction(0),
    )


def test_product_step_of_the_sample_and_threshold_theorem() -> None:
    """Every (gaining, losing) bucket pair at small sizes: the product divergence at e^(a+b) is at
    most the gaining bucket's at e^a, b = ln(1/(1-s)) (e^a, e^b as exact rationals)."""
    s, tau = Fraction(1, 3), 2
    e_b = 1 / (1 - s)
    for e_a in (Fraction(1), Fraction(5, 4), Fraction(2)):
        for m_gain, m_lose in itertools.product(range(0, 7), repeat=2):
            p1, q1 = released(m_gain + 1, s, tau), released(m_gain, s, tau)
            p2, q2 = released(m_lose, s, tau), released(m_lose + 1, s, tau)
            joint_p = {(x, y): a * b for x, a in p1.items() for y, b in p2.items()}
            joint_q = {(x, y): a * b for x, a in q1.items() for y, b in q2.items()}
            assert hockey(joint_p, joint_q, e_a * e_b) <= hockey(p1, q1, e_a)  # type: ignore[arg-type]


def components(sigma: tuple[int, ...], other: tuple[int, ...], blocks: int) -> int:
    """Connected components of the bipartite block graph (an edge per position)."""
    parent = list(range(2 * blocks))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(sigma, other, strict=True):
        parent[find(a)] = find(blocks + b)
    return len({find(x) for x in range(2 * blocks)})


def labelled_partitions(blocks: int, size: int) -> list[tuple[int, ...]]:
    """Every assignment of blocks * size positions to labelled blocks of exactly ``size``."""
    base = [b for b in range(blocks) for _ in range(size)]
    return sorted(set(itertools.permutations(base)))


def phi(n: int, m: int, q: int) -> Fraction:
    """The recursion of the share-hiding bound, exactly."""
    values = [Fraction(0), Fraction(1)]
    for j in range(2, n + 1):
        total = sum(
            (
                Fraction(math.comb(j - 1, k) * math.comb(j, k), math.comb(j * m, k * m)) * values[j - k]
                for k in range(1, j)
            ),
            Fraction(0),
        )
        values.append(1 + (q - 1) * total)
    return values[n]


@pytest.mark.parametrize(("n", "m", "q"), [(2, 2, 3), (2, 3, 5), (3, 2, 2), (3, 2, 7)])
def test_components_moment_is_below_the_recursion(n: int, m: int, q: int) -> None:
    """E[q^(C-1)] over two independent uniform partitions <= Phi(n): the new step of the bound."""
    partitions = labelled_partitions(n, m)
    moment = Fraction(0)
    for sigma, other in itertools.product(partitions, repeat=2):
        moment += Fraction(q) ** (components(sigma, other, n) - 1)
    moment /= len(partitions) ** 2
    assert moment <= phi(n, m, q)
    assert moment > 1  # the partitions sometimes split: the bound is not vacuous
