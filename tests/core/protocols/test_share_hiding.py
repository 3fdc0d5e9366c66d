"""The split-and-mix share-hiding bound holds for every batch at least as large as the one it is
evaluated at (issue 22 item 4; docs/mechanisms/multi_message_sum_binomial.md, step 5).

The old proof's step 5 ("an extra device is post-processing, so eta(n) holds at every n' >= n")
was invalid. Checked here, exactly: the true distance is NOT monotone in n (so nothing may assume
it); the code's eta(n) is at least the exact distance of the real view to its ideal at n and at
the larger batches n + 1, n + 2 (brute force over all inputs, exact rationals); the envelope is at
least Phi(j) - 1 at every j >= n we can compute exactly, including across the switch from the
exact recursion to the tail induction at 3000; and the stated epsilon of every split-and-mix
protocol does not fall below its value at a larger batch. No statistical assertion here.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from support.share_laws import exact_share_distance, hockey, view_law

from deniable.core import mechanisms
from deniable.core.amplification._share_hiding import EXACT_MAX_N, envelope_excess, exact_log_excess
from deniable.core.amplification.protocols import multi_sum_delta, share_hiding_distance
from deniable.core.mechanisms.exact import exp_lower_bound


@pytest.mark.parametrize(
    ("n", "m", "q", "larger"),
    [(2, 3, 2, 3), (2, 3, 3, 2), (2, 4, 3, 2), (2, 3, 4, 1), (2, 3, 5, 1), (3, 3, 2, 2)],
)
def test_bound_at_n_covers_the_exact_distance_of_larger_batches(n: int, m: int, q: int, larger: int) -> None:
    """eta as the code evaluates it at n >= the exact TV(real shuffled shares, ideal) at n..n+larger."""
    bound = Fraction(share_hiding_distance(n, m, q))
    for real_n in range(n, n + larger + 1):
        assert exact_share_distance(real_n, m, q) <= bound, real_n


def test_the_exact_distance_is_not_monotone_in_n() -> None:
    """Why step 5 needed a proof: with m = 3, q = 3 one more device moves the view FARTHER from
    its ideal (0.1728 at n = 2, 0.1920 at n = 3), and Phi rises from n = 2 to 3 at q = 5."""
    assert exact_share_distance(3, 3, 3) > exact_share_distance(2, 3, 3)
    assert exact_log_excess(3, 3, 5)[3] > exact_log_excess(3, 3, 5)[2]
    # the envelope at n = 2 is Phi(3)'s, not Phi(2)'s
    assert envelope_excess(2, 3, 5) >= math.exp(exact_log_excess(3, 3, 5)[3])


@pytest.mark.parametrize(("m", "q"), [(3, 2), (4, 3), (8, 1 << 10)])
def test_envelope_is_above_phi_at_every_larger_n_up_to_the_exact_limit(m: int, q: int) -> None:
    """sup over j >= n of the exact Phi(j) - 1 (j <= 400) never exceeds the envelope at n."""
    top = 400
    excess = [math.exp(v) if v > -math.inf else 0.0 for v in exact_log_excess(top, m, q)]
    for n in (2, 3, 5, 17, 50, 120, 399):
        assert max(excess[n:]) <= envelope_excess(n, m, q) * (1 + 1e-9), n


def test_tail_induction_beyond_the_exact_limit_is_valid_and_tight() -> None:
    """Across the switch at J = 3000 (m = 8, q = 2^20): the envelope at n > J bounds the exact
    Phi(j) - 1 computed to 3,200, and is within 10% of it (the bound is not loose)."""
    m, q, top = 8, 1 << 20, EXACT_MAX_N + 200
    excess = [math.exp(v) if v > -math.inf else 0.0 for v in exact_log_excess(top, m, q)]
    for n in (EXACT_MAX_N - 1, EXACT_MAX_N, EXACT_MAX_N + 1, EXACT_MAX_N + 20, EXACT_MAX_N + 150):
        envelope = envelope_excess(n, m, q)
        assert max(excess[n:]) <= envelope * (1 + 1e-9), n
        assert envelope <= 1.1 * excess[n], n


def test_the_bound_falls_with_n_at_the_deployed_sizes_and_refuses_two_shares() -> None:
    """At m = 8, q = 2^20 the real-n bound at 1e5 is far below the 3000 one the code used to
    state; m = 2 proves nothing for larger batches (eta = 1, the trivial bound)."""
    eta_3000 = share_hiding_distance(3000, 8, 1 << 20)
    eta_1e5 = share_hiding_distance(100_000, 8, 1 << 20)
    assert 9.3e-10 < eta_3000 < 9.4e-10
    assert eta_1e5 < eta_3000 * 1e-4
    assert share_hiding_distance(10, 2, 5) == 1.0


@pytest.mark.parametrize(("planned", "real"), [(2, 3)])
def test_whole_view_at_a_batch_larger_than_planned(planned: int, real: int) -> None:
    """A campaign planned for 2 devices whose batch holds 3 (p = 1/4, m = 3, q = 3): for every
    neighbouring pair, the exact hockey-stick of the whole real view at eps in {0.5, 1.5} is at most
    the delta the code states at the real n, and at most the one it states at the planned n."""
    m, q, p = 3, 3, Fraction(1, 4)
    for bits in itertools.product((0, 1), repeat=real - 1):
        a, b = view_law((*bits, 0), p, m, q), view_law((*bits, 1), p, m, q)
        for eps in (0.5, 1.5):
            exact = max(hockey(a, b, exp_lower_bound(eps)), hockey(b, a, exp_lower_bound(eps)))
            assert exact <= Fraction(multi_sum_delta(real, float(p), m, q, eps))
            assert exact <= Fraction(multi_sum_delta(planned, float(p), m, q, eps))


@pytest.mark.parametrize(
    "name", ["multi_message_sum", "multi_message_sum_binomial", "multi_message_histogram"]
)
def test_statement_at_the_smallest_batch_covers_every_larger_batch(name: str) -> None:
    """The aggregator states a release at its smallest batch: for every split-and-mix protocol the
    stated epsilon at n is at least the one at any larger real batch (planned for 2,000)."""
    domain = 4 if name == "multi_message_histogram" else 2
    mech = mechanisms.create(name, epsilon0=1.0, domain_size=domain, expected_n=2000)
    sizes = (1500, 2000, 2001, 2999, 3000, 3001, 5000, 40_000)
    stated = [mech.central_guarantee(n, 1e-6).epsilon for n in sizes]
    assert all(math.isfinite(e) for e in stated)
    assert all(later <= earlier for earlier, later in itertools.pairwise(stated)), stated
