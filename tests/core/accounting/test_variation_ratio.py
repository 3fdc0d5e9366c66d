"""Wang et al. 2024 variation-ratio reduction: its pair's divergence against an independent brute
force, against the GRR full blanket (nearly the same pair for GRR, other code), its parameters
against the paper's table, and the accountant's choice."""

from __future__ import annotations

import math
from math import comb

import numpy as np
import pytest
from scipy.stats import binom, multinomial

from deniable.core import mechanisms
from deniable.core.accounting import VariationRatio, best_bound, realised_probabilities
from deniable.core.accounting._variation import upper_tails, vr_delta
from deniable.core.accounting.analyses import GRRFullBlanket


def brute_delta(eps: float, p: float, beta: float, q: float, n: int) -> float:
    """max of both directions of D_{e^eps} over the full 2-D count law (scipy multinomial)."""
    alpha, others = beta / (p - 1), n - 1
    r = alpha * p / q
    counts = np.zeros((others + 1, others + 1))
    for i in range(others + 1):
        for j in range(others + 1 - i):
            counts[i, j] = multinomial.pmf([i, j, others - i - j], others, [r, r, 1 - 2 * r])
    big_p, big_q = np.zeros((others + 2, others + 2)), np.zeros((others + 2, others + 2))
    rest = 1 - alpha * (1 + p)
    for (a, b), under_p, under_q in (
        ((1, 0), alpha * p, alpha),
        ((0, 1), alpha, alpha * p),
        ((0, 0), rest, rest),
    ):
        big_p[a : a + others + 1, b : b + others + 1] += under_p * counts
        big_q[a : a + others + 1, b : b + others + 1] += under_q * counts
    e = math.exp(eps)
    return float(max(np.maximum(big_p - e * big_q, 0).sum(), np.maximum(big_q - e * big_p, 0).sum()))


@pytest.mark.parametrize(("eps0", "k", "n"), [(1.0, 4, 30), (2.0, 10, 40), (3.0, 3, 25), (0.5, 20, 45)])
def test_divergence_matches_brute_force_of_the_pair(eps0: float, k: int, n: int) -> None:
    p = math.exp(eps0)
    beta = (p - 1) / (p + k - 1)
    for eps in (0.05, 0.2, 0.5 * eps0):
        ours, brute = vr_delta(eps, p, beta, p, n), brute_delta(eps, p, beta, p, n)
        assert ours >= brute * (1 - 1e-12)
        assert ours == pytest.approx(brute, rel=1e-7, abs=1e-15)


def test_divergence_with_q_below_p_matches_brute_force() -> None:
    p, q = math.exp(2.0), math.exp(1.5)
    beta = 0.3
    for eps in (0.05, 0.3):
        assert vr_delta(eps, p, beta, q, 35) == pytest.approx(
            brute_delta(eps, p, beta, q, 35), rel=1e-7, abs=1e-15
        )


def test_tails_along_a_path_match_scipy() -> None:
    cs = np.arange(3, 9000, dtype=np.int64)
    xs = (0.43 * cs + 5 * np.sin(cs / 50.0)).astype(np.int64)  # steps of several sizes and signs
    ours = upper_tails(cs, xs)
    reference = binom.sf(xs - 1, cs, 0.5)
    assert np.max(np.abs(ours - reference)) < 1e-12


@pytest.mark.parametrize(("eps0", "k", "n"), [(1.0, 10, 3000), (4.0, 100, 20000), (2.0, 3, 5000)])
def test_never_above_and_close_to_the_full_grr_blanket(eps0: float, k: int, n: int) -> None:
    """For GRR the variation-ratio pair hides the blanket count the full blanket reveals: never
    above it, within 1% (two independent codes agreeing on nearly the same pair)."""
    keep, other = (float(x) for x in realised_probabilities("grr", eps0, k))
    ratio = keep / other
    vr = VariationRatio(eps0, n, ratio, keep - other, ratio)
    full = GRRFullBlanket(eps0, n, k, keep, other)
    assert full.evaluated_n == n
    for eps in (0.02, 0.1, 0.3):
        ours, blanket = vr.delta_for_epsilon(eps), full.delta_for_epsilon(eps)
        assert 0.99 * blanket - 1e-14 <= ours <= blanket * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize(("eps0", "d"), [(1.0, 16), (3.0, 100), (5.0, 64)])
def test_parameters_match_the_papers_table(eps0: float, d: int) -> None:
    """beta of Wang et al.'s parameter table (realised probabilities are floored: within 1e-9)."""
    e = math.exp(eps0)
    grr = mechanisms.create("grr", epsilon0=eps0, domain_size=d).variation_parameters()
    assert grr is not None and grr[1] == pytest.approx((e - 1) / (e + d - 1), rel=1e-9)
    hr = mechanisms.create("hadamard_response", epsilon0=eps0, domain_size=d)
    big_k, s = hr.order, hr.order // 2  # type: ignore[attr-defined]
    assert hr.variation_parameters()[1] == pytest.approx(  # type: ignore[index]
        (s * (e - 1) / 2) / (s * e + big_k - s), rel=1e-9
    )
    subset = mechanisms.create("subset_selection", epsilon0=eps0, domain_size=d)
    w = subset.subset_size  # type: ignore[attr-defined]
    table = (
        (e - 1)
        * (comb(d - 1, w - 1) - (comb(d - 2, w - 2) if w >= 2 else 0))
        / (e * comb(d - 1, w - 1) + comb(d - 1, w))
    )
    assert subset.variation_parameters()[1] == pytest.approx(table, rel=1e-9)  # type: ignore[index]
    oue = mechanisms.create("oue", epsilon0=eps0, domain_size=d).variation_parameters()
    assert oue is not None and oue[1] == pytest.approx(0.5 - 1 / (e + 1), rel=1e-9)
    sue = mechanisms.create("sue", epsilon0=eps0, domain_size=d).variation_parameters()
    assert sue is not None and sue[1] == pytest.approx(
        (math.exp(eps0 / 2) - 1) / (math.exp(eps0 / 2) + 1), rel=1e-9
    )


def test_total_variation_of_small_randomisers_is_exact() -> None:
    """beta equals the total variation of the exact output laws, worst pair of inputs."""
    for name, d in (("grr", 5), ("sue", 4), ("oue", 4), ("subset_selection", 6), ("hadamard_response", 6)):
        randomiser = mechanisms.create(name, epsilon0=1.5, domain_size=d)
        laws = [randomiser.output_distribution(v) for v in range(d)]
        worst = max(
            sum(max(laws[a].get(y, 0) - laws[b].get(y, 0), 0) for y in laws[a])
            for a in range(d)
            for b in range(d)
            if a != b
        )
        params = randomiser.variation_parameters()
        assert params is not None and params[1] == pytest.approx(float(worst), rel=1e-12), name


def test_accountant_picks_it_where_it_is_tightest_and_names_it() -> None:
    bound = best_bound(1.0, 10**7, 1e-6, "grr", 10)
    assert bound.analysis == VariationRatio.name and bound.evaluated_n == 0
    generic = best_bound(1.0, 10**7, 1e-6)
    assert bound.epsilon < 0.6 * generic.epsilon
    assert best_bound(1.0, 10**7, 1e-6, "binary_rr").analysis == "binary RR exact"


def test_not_a_variation_triple_is_refused() -> None:
    with pytest.raises(ValueError):
        VariationRatio(1.0, 100, math.e, 0.9, math.e)  # beta above (p - 1)/(p + 1)
