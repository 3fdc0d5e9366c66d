"""Central (epsilon, delta) of the shuffle-only protocols, each from its own analysis.

- Cheu et al. 2019 binary sums: the exact profile of shuffled binary RR at keep = 1 - gamma/2.
- Balcer & Cheu 2020 histograms: the exact hockey-stick profile of the two changed buckets'
  counts (x + Bin(n, p) each, composed exactly); their Theorem (n >= 100 ln(2/delta) / eps^2,
  1 - p = 50 ln(2/delta) / (eps^2 n)) is kept as a cross-check.
- Sample and threshold (Bharadwaj & Cormode 2022): the exact hockey-stick profile of the
  released, thresholded histogram (worst case over the other users), as Li, Qardaji, Su 2012.
- Multi-message summation: exact profile of the total noise (Polya differences, discrete Laplace
  at the planned n, or binomial differences) plus the split-and-mix share-hiding distance
  (second-moment bound, as in Balle et al. 2019 / Ghazi et al. 2020).

A protocol outside its analysis's validity gets ``not_applicable``: epsilon = inf, never a number
the analysis does not give.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Final

from deniable.core.amplification._binomial import chernoff_window, kl_bernoulli, pmf_run
from deniable.core.amplification.analyses import BinaryRRExact, NotApplicable, search_epsilon
from deniable.core.amplification.grid_search import dyadic_bracket, smallest_meeting
from deniable.core.amplification.shuffle import AmplificationBound

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

GRID_BITS: Final = 52  # noise probabilities are multiples of 2**-52: exact as doubles in params
GRID: Final = 1 << GRID_BITS
_SAFETY: Final = 1 + 1e-9  # relative margin on float-computed divergences
_LOG_TAIL: Final = 60.0  # pmf windows leave out at most e^-60 of mass

CHEU = "Cheu et al. 2019 randomiser: exact shuffled binary-RR profile"
BALCER_CHEU = "Balcer-Cheu 2020 histogram theorem"
BALCER_CHEU_EXACT = "Balcer-Cheu 2020 histogram: exact profile of the two changed buckets"
SAMPLE_THRESHOLD = "sample-and-threshold: exact profile of the released histogram"
MULTI_SUM = "multi-message sum: exact binomial-difference profile + split-and-mix distance"
MULTI_SUM_POLYA = "multi-message sum: exact Polya (discrete Laplace) noise profile + split-and-mix distance"


def not_applicable(analysis: str, reason: str) -> AmplificationBound:
    """No guarantee from this analysis: epsilon = inf (delta 1), with the reason."""
    return AmplificationBound(math.inf, 1.0, analysis, False, f"not applicable: {reason}")


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")


def grid_up(value: float) -> int:
    """Numerator of the smallest multiple of 2**-52 that is >= value (value in (0, 1])."""
    return min(GRID, max(1, math.ceil(value * GRID)))


# =========================================================================== Cheu et al. 2019


def cheu_keep(flip: Fraction) -> float:
    """Probability of reporting the true bit: 1 - gamma / 2 (exact as a double on the grid)."""
    return float(1 - flip / 2)


def cheu_local_epsilon(flip: Fraction) -> float:
    """ln((2 - gamma) / gamma): the local guarantee of every single report."""
    return math.inf if flip == 0 else math.log((2 - flip) / flip)


def cheu_guarantee(flip: Fraction, n: int, delta: float) -> AmplificationBound:
    """Exact shuffled binary-RR profile at keep = 1 - gamma/2 for n reports; local eps if better."""
    _check_delta(delta)
    local = cheu_local_epsilon(flip)
    if flip >= 1:
        return AmplificationBound(0.0, 0.0, CHEU, True, "gamma = 1: every report is a fair coin")
    if n <= 1:
        return AmplificationBound(local, 0.0, CHEU, False, f"n={n}: only the local guarantee holds")
    analysis = BinaryRRExact(local, int(n), cheu_keep(flip))
    try:
        epsilon = analysis.epsilon_for_delta(delta)
    except NotApplicable as exc:
        return AmplificationBound(local, 0.0, CHEU, False, f"exact profile not applicable ({exc}); local")
    note = f"gamma={float(flip):.6g}, local eps={local:.4g}"
    if analysis.detail():
        note += f"; {analysis.detail()}"
    if epsilon >= local:
        return AmplificationBound(local, 0.0, CHEU, False, note + "; no amplification, local guarantee")
    return AmplificationBound(epsilon, delta, CHEU, True, note)


def cheu_delta(flip: Fraction, n: int, epsilon: float) -> float:
    """delta(eps) of n shuffled Cheu et al. reports: the exact binary-RR profile (0 at eps_L)."""
    local = cheu_local_epsilon(flip)
    if flip >= 1 or epsilon >= local:
        return 0.0
    if n <= 1:
        return 1.0
    return BinaryRRExact(local, int(n), cheu_keep(flip)).delta_for_epsilon(epsilon)


@functools.lru_cache(maxsize=64)
def cheu_flip_for_target(epsilon: float, delta: float, n: int) -> int:
    """Numerator g of the smallest gamma = g / 2**52 (to 1/128 relative) meeting (eps, delta) at n."""
    _check_delta(delta)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("the target epsilon must be positive and finite")
    if n < 2:
        raise ValueError("expected_n must be at least 2")

    def meets(g: int) -> bool:
        return cheu_guarantee(Fraction(g, GRID), n, delta).epsilon <= epsilon

    return smallest_meeting(meets, *dyadic_bracket(meets, GRID_BITS))  # gamma = 1 always meets it


# =========================================================================== Balcer & Cheu 2020


def balcer_cheu_gamma(epsilon: float, delta: float, n: int) -> int:
    """The paper's 1 - p = 50 ln(2/delta_b) / (eps_b^2 n) as a grid numerator, rounded up (the
    theorem's calibration, kept for comparison: the exact profile needs ~70x less); ValueError if invalid.

    eps_b, delta_b = eps/2, delta/2 per bucket (two buckets change); needs eps_b <= 1, n >= 2x that.
    """
    _check_delta(delta)
    if not (math.isfinite(epsilon) and 0 < epsilon <= 2):
        raise ValueError(
            f"Balcer-Cheu needs a target epsilon in (0, 2] (eps/2 <= 1 per bucket), got {epsilon}"
        )
    eps_b, delta_b = epsilon / 2, delta / 2
    needed = 100 * math.log(2 / delta_b) / eps_b**2
    if n < needed:
        raise ValueError(
            f"Balcer-Cheu needs expected_n >= 100 ln(2/(delta/2)) / (eps/2)^2 = {math.ceil(needed)}, got {n}"
        )
    return grid_up(50 * math.log(2 / delta_b) / (eps_b**2 * n) * (1 + 1e-12))


def balcer_cheu_guarantee(gamma: Fraction, n: int, delta: float) -> AmplificationBound:
    """(2 eps_b, delta) with eps_b = sqrt(50 ln(4/delta) / ((1 - p) n)), when eps_b <= 1, 1 - p <= 1/2."""
    _check_delta(delta)
    if n < 1:
        return not_applicable(BALCER_CHEU, "no devices")
    if gamma > Fraction(1, 2):
        return not_applicable(BALCER_CHEU, f"1 - p = {float(gamma):.4g} > 1/2, outside the theorem")
    eps_b = math.sqrt(50 * math.log(4 / delta) / (float(gamma) * n)) * (1 + 1e-14)
    if eps_b > 1:
        return not_applicable(
            BALCER_CHEU, f"n={n} gives eps per bucket {eps_b:.4g} > 1, outside the theorem's range"
        )
    note = (
        f"per bucket (eps, delta) = ({eps_b:.4g}, {delta / 2:.3g}) for 1 - p = {float(gamma):.6g}, n={n};"
        " a changed value moves two buckets: (2 eps, 2 delta/2)"
    )
    return AmplificationBound(2 * eps_b, delta, BALCER_CHEU, True, note)


# Exact composition of the two buckets a changed value moves (shared by the histograms).


def _shift_components(pmf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(P_a, Q_a, P_b, Q_b) on one grid: bucket a gains the device (W + 1 vs W), b loses it."""
    shifted = np.concatenate(([0.0], pmf))
    here = np.concatenate((pmf, [0.0]))
    return shifted, here, here, shifted


def two_bucket_delta(pmf: np.ndarray, neglected: float, epsilon: float) -> float:
    """Exact D_{e^eps}((W_a + 1, W_b) || (W_a, W_b + 1)), W_a, W_b iid with law ``pmf``.

    For each a-outcome the b-outcomes with total privacy loss above eps are a suffix in loss order,
    so the double sum is one sort and prefix sums; the window's missing mass (2 x ``neglected``)
    is added. The pair is symmetric, so this is the divergence in both directions.
    """
    p_a, q_a, p_b, q_b = _shift_components(np.asarray(pmf, dtype=np.float64))
    with np.errstate(divide="ignore"):
        loss_a = np.log(p_a) - np.log(q_a)
        loss_b = np.log(p_b) - np.log(q_b)
    keep_a, keep_b = p_a > 0, p_b > 0
    loss_a, p_a, q_a = loss_a[keep_a], p_a[keep_a], q_a[keep_a]
    order = np.argsort(loss_b[keep_b], kind="stable")
    sorted_loss = loss_b[keep_b][order]
    p_suffix = np.concatenate((np.cumsum(p_b[keep_b][order][::-1])[::-1], [0.0]))
    q_suffix = np.concatenate((np.cumsum(q_b[keep_b][order][::-1])[::-1], [0.0]))
    start = np.searchsorted(sorted_loss, epsilon - loss_a, side="right")
    terms = p_a * p_suffix[start] - math.exp(epsilon) * q_a * q_suffix[start]
    hockey = float(np.clip(terms, 0.0, None).sum())
    return min(1.0, hockey * _SAFETY + 2 * neglected + 1e-300)


def smallest_epsilon(profile: Callable[[float], float], delta: float) -> float:
    """Smallest eps (to ~1e-6 relative, from above) with profile(eps) <= delta; inf above eps = 64."""
    upper = 0.25
    while profile(upper) > delta:
        upper *= 2
        if upper > 64:
            return math.inf
    return search_epsilon(profile, delta, upper)


# =========================================================================== Balcer & Cheu, exact


@functools.lru_cache(maxsize=256)
def _skip_law(n: int, gamma: float) -> tuple[np.ndarray, float]:
    """pmf of N' ~ Bin(n, 1 - p) (skipped noise messages) on its Chernoff window, and the cut mass."""
    lo, hi, neglected = chernoff_window(n, gamma, _LOG_TAIL)
    return pmf_run(lo, hi - lo + 1, n, gamma), neglected


def balcer_cheu_exact_delta(gamma: Fraction, n: int, epsilon: float) -> float:
    """Exact delta(eps) of the shuffled counts: c_j = x_j + n - N'_j, two buckets changed.

    The reflection W = -N' maps the pair to the same one-gains-one-loses shape, so the profile of
    N' serves. 1 with no devices; 0 when gamma = 0 is excluded (gamma lies in (0, 1/2]).
    """
    if n < 1 or epsilon < 0:
        return 1.0
    pmf, neglected = _skip_law(int(n), float(gamma))
    return two_bucket_delta(pmf, neglected, epsilon)


@functools.lru_cache(maxsize=512)
def balcer_cheu_exact_guarantee(gamma: Fraction, n: int, delta: float) -> AmplificationBound:
    """Smallest eps whose exact two-bucket profile is <= delta at n devices and 1 - p = gamma."""
    _check_delta(delta)
    if n < 1:
        return not_applicable(BALCER_CHEU_EXACT, "no devices")
    if not 0 < gamma <= Fraction(1, 2):
        return not_applicable(BALCER_CHEU_EXACT, f"1 - p = {float(gamma):.4g} outside (0, 1/2]")
    epsilon = smallest_epsilon(lambda eps: balcer_cheu_exact_delta(gamma, n, eps), delta)
    if math.isinf(epsilon):
        return not_applicable(BALCER_CHEU_EXACT, f"no epsilon below 64 reaches delta={delta:g} at n={n}")
    theorem = balcer_cheu_guarantee(gamma, n, delta)
    note = f"1 - p = {float(gamma):.6g}, n={n}; two changed buckets composed exactly; theorem: " + (
        f"eps = {theorem.epsilon:.4g}" if theorem.amplified else "not applicable"
    )
    return AmplificationBound(epsilon, delta, BALCER_CHEU_EXACT, True, note)


def _bc_meets(numerator: int, epsilon: float, delta: float, n: int) -> bool:
    return balcer_cheu_exact_guarantee(Fraction(numerator, GRID), n, delta).epsilon <= epsilon


def balcer_cheu_min_n(epsilon: float, delta: float) -> int:
    """Smallest n at which 1 - p = 1/2 (the most noise the protocol allows) meets (eps, delta)."""
    half = GRID // 2
    hi = 2
    while not _bc_meets(half, epsilon, delta, hi):
        hi *= 2
        if hi > 1 << 40:
            raise ValueError(f"Balcer-Cheu cannot reach epsilon={epsilon:g}, delta={delta:g} at any n")
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _bc_meets(half, epsilon, delta, mid):
            hi = mid
        else:
            lo = mid
    return hi


@functools.lru_cache(maxsize=128)
def balcer_cheu_exact_gamma(epsilon: float, delta: float, n: int) -> int:
    """Grid numerator of the smallest 1 - p (to 1/128 relative) whose exact profile meets the target.

    ValueError naming the smallest n that would when even 1 - p = 1/2 does not.
    """
    _check_delta(delta)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("the target epsilon must be positive and finite")
    half = GRID // 2
    if not _bc_meets(half, epsilon, delta, n):
        raise ValueError(
            f"balcer_cheu_histogram cannot reach epsilon={epsilon:g}, delta={delta:g} at expected_n={n};"
            f" the smallest n that can is {balcer_cheu_min_n(epsilon, delta)}"
        )

    def meets(g: int) -> bool:
        return _bc_meets(g, epsilon, delta, n)

    return smallest_meeting(meets, *dyadic_bracket(meets, GRID_BITS - 1))  # 2**(GRID_BITS-1) = 1/2 meets


# =========================================================================== sample and threshold

_ST_MAX_ROWS: Final = 3000


def sample_threshold_add_delta(rate: float, threshold: int, epsilon: float) -> float:
    """sup over m of D_{e^eps}(R(Bin(m+1, s)) || R(Bin(m, s))), R zeroing counts <= tau.

    See docs/mechanisms/sample_and_threshold.md for the derivation.
    """
    # At a released k > tau the likelihood ratio is (1 - s)(m + 1) / (m + 1 - k), so
    # D_m = sum_{k > tau} P[Bin(m+1, s) = k] (1 - e^eps (m + 1 - k) / ((1 - s)(m + 1)))_+; the
    # suppressed output never contributes. The Chernoff bound on Bin(m+1, s) exceeding
    # (m+1)(1 - (1 - s) e^-eps) bounds every later D_m: the scan stops once it is below the
    # largest D_m seen, or adds it after the row cap.
    s = rate
    if epsilon <= 0:
        return 1.0
    bad_fraction = 1 - (1 - s) * math.exp(-epsilon)
    kl = kl_bernoulli(bad_fraction, s)
    if kl < 1e-9:
        return 1.0
    e = math.exp(epsilon)
    worst = 0.0
    row = np.array([1.0])  # P[Bin(size, s) = k], k = 0..size, advanced by one trial per step
    for size in range(1, threshold + _ST_MAX_ROWS + 2):
        row = np.concatenate((row * (1 - s), [0.0])) + np.concatenate(([0.0], row * s))
        start = max(threshold + 1, math.floor(size * bad_fraction))
        if start <= size:  # m = size - 1 >= threshold
            ks = np.arange(start, size + 1, dtype=np.float64)
            factor = np.clip(1 - e * (size - ks) / ((1 - s) * size), 0.0, None)
            worst = max(worst, float(np.dot(row[start:], factor)))
        beyond = math.exp(-(size + 1) * kl)  # bounds D_m' for every m' > size - 1
        if size > threshold and beyond <= worst:
            break
    else:
        worst = max(worst, beyond)
    return min(1.0, worst * _SAFETY + 1e-300)


def sample_threshold_delta(rate: float, threshold: int, epsilon: float) -> float:
    """delta(eps) of the released histogram: the gaining bucket's profile at eps - ln(1/(1-s))
    (the losing bucket is pure ln(1/(1-s))); 1 at or below that."""
    removal = -math.log1p(-rate)
    if not 0 < rate < 1 or threshold < 0 or epsilon <= removal:
        return 1.0
    return sample_threshold_add_delta(rate, threshold, epsilon - removal)


@functools.lru_cache(maxsize=256)
def sample_threshold_guarantee(rate: float, threshold: int, delta: float) -> AmplificationBound:
    """(eps_add + ln(1/(1-s)), delta) for the released histogram under replacement neighbours.

    One bucket gains the user (profile above), the other loses it (pure ln(1/(1-s))): composed.
    """
    _check_delta(delta)
    if not 0 < rate < 1 or threshold < 0:
        return not_applicable(SAMPLE_THRESHOLD, f"sample rate {rate} / threshold {threshold} out of range")
    if rate ** (threshold + 1) > delta:
        return not_applicable(
            SAMPLE_THRESHOLD, f"s^(tau+1) = {rate ** (threshold + 1):.3g} > delta: all tau+1 sampled"
        )

    def profile(eps: float) -> float:
        return sample_threshold_add_delta(rate, threshold, eps)

    upper = 0.25
    while profile(upper) > delta:
        upper *= 2
        if upper > 64:
            return not_applicable(SAMPLE_THRESHOLD, f"no epsilon below 64 reaches delta={delta:g}")
    eps_add = search_epsilon(profile, delta, upper)
    removal = -math.log1p(-rate)
    note = (
        f"released histogram only (suppressed counts and the raw sampled counts are the aggregator's);"
        f" eps = {eps_add:.4g} (bucket gaining the user) + ln(1/(1-s)) = {removal:.4g} (bucket losing it)"
    )
    return AmplificationBound(eps_add + removal, delta, SAMPLE_THRESHOLD, True, note)


# =========================================================================== multi-message sum


@functools.lru_cache(maxsize=64)
def binomial_difference(n: int, p: float) -> tuple[int, np.ndarray, float]:
    """(offset, pmf, neglected): P[W = offset + i] for W = Bin(n, p) - Bin(n, p), windowed."""
    lo, hi, neglected = chernoff_window(n, p, _LOG_TAIL)
    single = pmf_run(lo, hi - lo + 1, n, p)
    pmf = np.convolve(single, single[::-1])
    return lo - hi, pmf, min(1.0, 2 * neglected)


POLYA_EXACT_RATIO: Final = 8  # the noise law is taken at the real n up to 8 x the planned devices


def polya_difference(n: int, shares: int, nonzero: float) -> tuple[int, np.ndarray, float]:
    """(offset, pmf, neglected) of the noise for the privacy profile: polya_law at the real n, up
    to POLYA_EXACT_RATIO x shares devices.

    Beyond that, NB(s) = NB(r) + NB(s - r) independent: the extra devices only add noise
    (post-processing), so the profile at r = 8 x shares devices stays valid (and the support small).
    """
    return polya_law(min(n, POLYA_EXACT_RATIO * shares), shares, nonzero)


@functools.lru_cache(maxsize=64)
def polya_law(n: int, shares: int, nonzero: float) -> tuple[int, np.ndarray, float]:
    """(offset, pmf, neglected) for W = Y - Y', Y, Y' ~ NB(n / shares, a), a = 1 - (1 - nonzero)^shares.

    The sum of n devices' Polya draws (each NB(1/shares, a)); the pmf runs on a window whose
    outside mass ("neglected") is at most 2 e^-60.
    """
    from deniable.core.amplification._flooded import polya_single  # numpy at module level: lazily

    single, tail = polya_single(n, shares, nonzero)
    pmf = np.convolve(single, single[::-1])
    return 1 - len(single), pmf, min(1.0, 2 * tail)


def noise_law(n: int, p: float, polya_shares: int = 0) -> tuple[int, np.ndarray, float]:
    """The total noise of n devices: Polya differences if ``polya_shares`` > 0, else binomial."""
    return polya_difference(n, polya_shares, p) if polya_shares > 0 else binomial_difference(n, p)


def noise_delta(n: int, p: float, epsilon: float, polya_shares: int = 0) -> float:
    """D_{e^eps}(S + 1 + W || S + W) for the total noise W (symmetric: both directions)."""
    if n == 0 or p == 0:
        return 1.0
    _, pmf, neglected = noise_law(n, p, polya_shares)
    shifted = np.concatenate(([0.0], pmf))  # P[W = w - 1] aligned with P[W = w]
    here = np.concatenate((pmf, [0.0]))
    hockey = float(np.clip(shifted - math.exp(epsilon) * here, 0.0, None).sum())
    return min(1.0, hockey * _SAFETY + neglected + 1e-300)


def share_hiding_distance(n: int, m: int, q: int) -> float:
    """Bound on sup_v TV(shuffled shares of v, uniform shares with the same sum) that holds for
    every batch of n or more devices (``_share_hiding``; derivation in
    docs/mechanisms/multi_message_sum_binomial.md). No monotonicity in n is assumed."""
    from deniable.core.amplification._share_hiding import share_distance

    return share_distance(n, m, q)


def multi_sum_delta(n: int, p: float, m: int, q: int, epsilon: float, polya_shares: int = 0) -> float:
    """delta of the whole view at eps: noise profile + (1 + e^eps) x share-hiding distance."""
    return min(
        1.0,
        noise_delta(n, p, epsilon, polya_shares) + (1 + math.exp(epsilon)) * share_hiding_distance(n, m, q),
    )


def _split_and_mix_refusal(
    analysis: str, n: int, m: int, q: int, delta: float, share_terms: int
) -> AmplificationBound | None:
    """Why a split-and-mix analysis says nothing before any search (no devices, or its
    share-hiding terms, 2 x share_terms x eta, spend delta already); None when it can proceed."""
    _check_delta(delta)
    if n < 1:
        return not_applicable(analysis, "no devices")
    eta = share_hiding_distance(n, m, q)
    if 2 * share_terms * eta >= delta:
        return not_applicable(
            analysis, f"share-hiding distance {eta:.3g} (m={m}, q={q}, n={n}) leaves nothing of delta"
        )
    return None


@functools.lru_cache(maxsize=256)
def multi_sum_guarantee(
    n: int, p: float, m: int, q: int, delta: float, polya_shares: int = 0
) -> AmplificationBound:
    """Smallest eps with multi_sum_delta <= delta (the noise term falls with eps, the share term rises).

    ``polya_shares`` > 0: each device's noise is a difference of NB(1/polya_shares, a) draws
    (discrete Laplace in total at polya_shares devices); 0: Bernoulli(p) differences.
    """
    analysis = MULTI_SUM_POLYA if polya_shares > 0 else MULTI_SUM
    refusal = _split_and_mix_refusal(analysis, n, m, q, delta, share_terms=1)
    if refusal is not None:
        return refusal
    eta = share_hiding_distance(n, m, q)

    def total(eps: float) -> float:
        return multi_sum_delta(n, p, m, q, eps, polya_shares)

    bracket = _scan_up(total, delta)
    if bracket is None:
        return not_applicable(analysis, f"no epsilon below 50 reaches delta={delta:g} at n={n}")
    previous, upper = bracket
    upper = _bisect_crossing(total, delta, previous, upper) if previous > 0 or total(0.0) > delta else 0.0
    law = (
        f"NB(n/{polya_shares}, a)-NB(n/{polya_shares}, a), P[draw > 0]={p:.6g}"
        if polya_shares > 0
        else f"Bin(n,p)-Bin(n,p), p={p:.6g}"
    )
    note = (
        f"noise {law}, n={n}: delta_noise={noise_delta(n, p, upper, polya_shares):.3g};"
        f" split-and-mix m={m}, q={q}: TV <= {eta:.3g} (x (1 + e^eps))"
    )
    return AmplificationBound(upper, delta, analysis, True, note)


# =========================================================================== multi-message histogram

MULTI_HISTOGRAM = "multi-message histogram: exact two-bucket Polya noise profile + 2 split-and-mix distances"


def multi_histogram_noise_delta(n: int, p: float, shares: int, epsilon: float) -> float:
    """Exact two-bucket profile of the per-bucket Polya noise totals (one bucket gains, one loses)."""
    if n < 1:
        return 1.0
    _, pmf, neglected = polya_difference(int(n), shares, p)
    return two_bucket_delta(pmf, neglected, epsilon)


def multi_histogram_delta(n: int, p: float, m: int, q: int, epsilon: float, shares: int) -> float:
    """delta of the whole view at eps: two-bucket noise profile + (1 + e^eps) x 2 share distances.

    Only the two changed buckets' messages differ in law; each is replaced by its ideal (uniform
    shares given the sum) at total variation <= eta under either dataset.
    """
    eta = share_hiding_distance(n, m, q)
    noise = multi_histogram_noise_delta(n, p, shares, epsilon)
    return min(1.0, noise + (1 + math.exp(epsilon)) * 2 * eta)


def _scan_up(total: Callable[[float], float], delta: float) -> tuple[float, float] | None:
    """(previous, upper): the first upper in 1/64, 1/64 x 1.25, ... with total(upper) <= delta and
    the step before it (0 for the first); None past 50."""
    previous, upper = 0.0, 1 / 64
    while total(upper) > delta:
        previous, upper = upper, upper * 1.25
        if upper > 50:
            return None
    return previous, upper


def _bisect_crossing(total: Callable[[float], float], delta: float, previous: float, upper: float) -> float:
    """Narrow total(previous) > delta >= total(upper) to 1e-9 relative; the valid end is returned."""
    for _ in range(60):
        mid = (previous + upper) / 2
        if total(mid) <= delta:
            upper = mid
        else:
            previous = mid
        if upper - previous <= 1e-9 * upper:
            break
    return upper


def _first_crossing(total: Callable[[float], float], delta: float) -> float:
    """Smallest eps (to 1e-9 relative) with total(eps) <= delta scanning up from 0; inf past 50."""
    if total(0.0) <= delta:
        return 0.0
    bracket = _scan_up(total, delta)
    return math.inf if bracket is None else _bisect_crossing(total, delta, *bracket)


@functools.lru_cache(maxsize=256)
def multi_histogram_guarantee(
    n: int, p: float, m: int, q: int, delta: float, shares: int
) -> AmplificationBound:
    """Smallest eps with multi_histogram_delta <= delta at n devices."""
    refusal = _split_and_mix_refusal(MULTI_HISTOGRAM, n, m, q, delta, share_terms=2)
    if refusal is not None:
        return refusal
    eta = share_hiding_distance(n, m, q)
    epsilon = _first_crossing(lambda eps: multi_histogram_delta(n, p, m, q, eps, shares), delta)
    if math.isinf(epsilon):
        return not_applicable(MULTI_HISTOGRAM, f"no epsilon below 50 reaches delta={delta:g} at n={n}")
    note = (
        f"per bucket NB(n/{shares}, a) - NB(n/{shares}, a), P[draw > 0]={p:.6g}, n={n}: two buckets composed"
        f" exactly, delta_noise={multi_histogram_noise_delta(n, p, shares, epsilon):.3g};"
        f" split-and-mix m={m}, q={q}: TV <= {eta:.3g} per bucket (x 2 (1 + e^eps))"
    )
    return AmplificationBound(epsilon, delta, MULTI_HISTOGRAM, True, note)


# =========================================================================== flooded histogram

FLOODED_HISTOGRAM = "flooded histogram: exact two-bucket profile of the (+1, -1) counts per bucket"


@functools.lru_cache(maxsize=256)
def flooded_histogram_guarantee(
    n: int, p: float, rate: float, shares: int, delta: float, flood_shares: int = 0
) -> AmplificationBound:
    """Smallest eps with the exact two-bucket profile (``_flooded.flooded_delta``) <= delta at n;
    ``flood_shares`` 0: Bernoulli(rate) flood pairs per device, else NB(1/flood_shares, b) pairs."""
    from deniable.core.amplification._flooded import flooded_delta

    _check_delta(delta)
    if n < 1:
        return not_applicable(FLOODED_HISTOGRAM, "no devices")
    epsilon = _first_crossing(lambda eps: flooded_delta(n, shares, p, rate, eps, flood_shares), delta)
    if math.isinf(epsilon):
        return not_applicable(FLOODED_HISTOGRAM, f"no epsilon below 50 reaches delta={delta:g} at n={n}")
    flood = (
        f"F ~ Bin(n={n}, {rate:.6g})"
        if flood_shares == 0
        else f"F ~ NB(n/{flood_shares}, b), P[device's pairs > 0]={rate:.6g}"
    )
    note = (
        f"per bucket +1: S + N1 + F, -1: N2 + F; N ~ NB(n/{shares}, a), P[draw > 0]={p:.6g};"
        f" {flood}; two buckets composed exactly"
    )
    return AmplificationBound(epsilon, delta, FLOODED_HISTOGRAM, True, note)
