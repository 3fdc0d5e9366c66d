"""Statistical privacy audit of a randomiser: a sound lower bound on its empirical epsilon.

External auditors (and our tests) sample ``randomise`` on two inputs, group outputs into events
fixed in advance (``event_of``: any function of the payload, e.g. "bit j of a unary encoding",
which is post-processing and so keeps the bound sound), and compute one-sided Clopper–Pearson
bounds for every event in both directions, Bonferroni-corrected. With probability at least
1 - alpha every bound holds, and then the returned value is at most the true epsilon: a result
above the claimed epsilon0 is evidence, at level alpha, that the claim is false.

Also for auditors: ``project_law``, ``audit_cannot_miss`` and ``sufficient_samples`` size an
audit from exact laws before sampling; ``chi_square_fit`` checks that ``randomise`` samples
``output_distribution``; ``sampled_rounds`` and ``check_estimator`` check that ``estimate`` is
unbiased, with the variance and CI coverage it states; ``timing_separation`` checks that running
time does not tell inputs (or kept from flipped answers) apart.

Needs scipy (installed with the ``dev`` extra).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeVar

import numpy as np

from deniable.core.mechanisms.base import FloatArray, IntArray, LocalRandomiser
from deniable.core.rng import Csprng

K = TypeVar("K", bound=Hashable)


def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided lower confidence bound for a binomial proportion: P(p < bound) <= alpha."""
    from scipy import stats

    return 0.0 if successes <= 0 else float(stats.beta.ppf(alpha, successes, trials - successes + 1))


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided upper confidence bound for a binomial proportion: P(p > bound) <= alpha."""
    from scipy import stats

    return 1.0 if successes >= trials else float(stats.beta.isf(alpha, successes + 1, trials - successes))


def epsilon_lower_bound(
    counts_a: Mapping[Hashable, int],
    trials_a: int,
    counts_b: Mapping[Hashable, int],
    trials_b: int,
    events: Sequence[Hashable],
    alpha: float,
) -> float:
    """Lower confidence bound (level 1 - alpha) on max over events of |ln P_a(S) / P_b(S)|."""
    if not events:
        raise ValueError("an audit needs at least one event")
    level = alpha / (4 * len(events))
    best = 0.0
    for event in events:
        xa, xb = int(counts_a.get(event, 0)), int(counts_b.get(event, 0))
        for top, top_n, bottom, bottom_n in ((xa, trials_a, xb, trials_b), (xb, trials_b, xa, trials_a)):
            best = max(best, _log_ratio_bound(top, top_n, bottom, bottom_n, level))
    return best


def _log_ratio_bound(top: int, top_n: int, bottom: int, bottom_n: int, level: float) -> float:
    """ln(lower bound of P_top / upper bound of P_bottom) at ``level`` each; -inf if no evidence."""
    low = clopper_pearson_lower(top, top_n, level)
    return math.log(low / clopper_pearson_upper(bottom, bottom_n, level)) if low > 0 else -math.inf


@dataclass(frozen=True)
class AuditResult:
    """What an audit found for one pair of inputs."""

    claimed_epsilon: float
    epsilon_lower_bound: float
    samples_per_input: int
    alpha: float

    @property
    def refutes_claim(self) -> bool:
        """True if the data show, at level alpha, that the randomiser is not claimed_epsilon-DP."""
        return self.epsilon_lower_bound > self.claimed_epsilon


def audit(
    randomiser: LocalRandomiser,
    value_a: int,
    value_b: int,
    samples: int,
    *,
    alpha: float = 1e-6,
    events: Sequence[Hashable] | None = None,
    event_of: Callable[[bytes], Hashable] | None = None,
    rng: Csprng | None = None,
) -> AuditResult:
    """Sample ``randomise`` ``samples`` times on each input and bound its epsilon from below.

    ``events`` must be chosen before sampling; by default they are all outputs of
    ``output_distribution`` for the two inputs (mapped through ``event_of``). For mechanisms with
    several events per payload (``event_of`` returning a tuple of keys is not supported), audit one
    projection at a time.
    """
    key = event_of or (lambda payload: payload)
    if events is None:
        support = set(randomiser.output_distribution(value_a)) | set(randomiser.output_distribution(value_b))
        events = sorted({key(p) for p in support}, key=repr)
    counts_a: Counter[Hashable] = Counter(key(p) for p in randomiser.randomise_many([value_a] * samples, rng))
    counts_b: Counter[Hashable] = Counter(key(p) for p in randomiser.randomise_many([value_b] * samples, rng))
    bound = epsilon_lower_bound(counts_a, samples, counts_b, samples, events, alpha)
    return AuditResult(randomiser.epsilon0, bound, samples, alpha)


# ----------------------------------------------------------------------------- planning an audit


def project_law(law: Mapping[bytes, Fraction], event_of: Callable[[bytes], K]) -> dict[K, Fraction]:
    """The exact law of ``event_of(payload)``: what an ``audit`` with that ``event_of`` samples."""
    out: dict[K, Fraction] = {}
    for payload, p in law.items():
        event = event_of(payload)
        out[event] = out.get(event, Fraction(0)) + p
    return out


def audit_cannot_miss(
    law_a: Mapping[K, Fraction],
    law_b: Mapping[K, Fraction],
    samples: int,
    threshold: float,
    *,
    alpha: float = 1e-6,
    miss: float = 1e-6,
    events: Sequence[K] | None = None,
) -> bool:
    """True if ``audit`` with ``samples`` per input beats ``threshold`` w.p. >= 1 - miss: sizes an audit."""
    # law_a, law_b: the exact laws of the audited events for the two inputs; alpha and events as
    # given to ``audit`` (default events: every key of either law). For one event and direction,
    # counts at the exact binomial miss/2 quantiles on the unfavourable side (top count low,
    # bottom count high) still give a bound above ``threshold``; the bound is monotone in each
    # count, so any likelier draw does too, and both quantiles hold except w.p. <= miss.
    from scipy import stats

    chosen = list(dict.fromkeys([*law_a, *law_b])) if events is None else events
    if not chosen:
        raise ValueError("an audit needs at least one event")
    level = alpha / (4 * len(chosen))
    for event in chosen:
        pa, pb = float(law_a.get(event, 0)), float(law_b.get(event, 0))
        for top, bottom in ((pa, pb), (pb, pa)):
            x_top = int(stats.binom.ppf(miss / 2, samples, top))
            x_bottom = int(stats.binom.isf(miss / 2, samples, bottom))
            if _log_ratio_bound(x_top, samples, x_bottom, samples, level) > threshold:
                return True
    return False


def sufficient_samples(
    law_a: Mapping[K, Fraction],
    law_b: Mapping[K, Fraction],
    threshold: float,
    ladder: Sequence[int],
    *,
    alpha: float = 1e-6,
    miss: float = 1e-6,
    events: Sequence[K] | None = None,
) -> int | None:
    """The least size on ``ladder`` at which ``audit_cannot_miss`` holds, or None: the cheapest sure audit."""
    for n in ladder:
        if audit_cannot_miss(law_a, law_b, n, threshold, alpha=alpha, miss=miss, events=events):
            return n
    return None


# ----------------------------------------------------------------------------- goodness of fit


@dataclass(frozen=True)
class GoodnessOfFit:
    """A sample of outputs against an exact law: Pearson's statistic (for reading) and the exact
    per-cell binomial test that decides.

    Pearson's chi-square approximation is too light in the far tail when a cell expects few
    outputs (a cell expecting 5 exceeds the 1-df critical value at alpha = 1e-6 about 70 times as
    often as stated), so the decision uses exact binomial tails instead: each cell's count is
    Binomial(n, p) under the law, and the fit rejects when a cell's two-sided exact p-value is at
    most ``alpha / cells`` (Bonferroni). The false-rejection rate is then at most ``alpha``, with
    no approximation.
    """

    statistic: float
    critical: float
    cells: int
    smallest_p: float
    alpha: float

    @property
    def rejects(self) -> bool:
        """True if the sample shows, at level alpha (exactly), that the outputs do not follow the law."""
        return self.smallest_p <= self.alpha / self.cells


def chi_square_fit(
    observed: Mapping[K, int], law: Mapping[K, Fraction], alpha: float = 1e-6
) -> GoodnessOfFit:
    """Fit of observed outputs to an exact law: does ``randomise`` sample its law (``GoodnessOfFit``)."""
    # An output outside the law's support fails outright (exactly, not statistically). Outputs
    # expected fewer than 5 times are pooled, least likely first, into one cell grown until it
    # expects >= 5 (a pooled cell is still exactly binomial); with no such outputs every output is
    # its own cell.
    from scipy import stats

    support = {output for output, p in law.items() if p > 0}
    if any(count and output not in support for output, count in observed.items()):
        raise ValueError("an output outside the law's support was observed")
    n = sum(observed.values())
    cells = _pooled_cells(observed, law, n)
    if len(cells) < 2:
        raise ValueError("too few samples: a fit needs two cells expected at least 5 times each")
    statistic = sum((o - n * p) ** 2 / (n * p) for p, o in cells)
    probabilities = np.array([p for p, _ in cells])
    counts = np.array([o for _, o in cells])
    lower = stats.binom.cdf(counts, n, probabilities)
    upper = stats.binom.sf(counts - 1, n, probabilities)
    smallest_p = float(np.min(np.minimum(1.0, 2 * np.minimum(lower, upper))))
    critical = float(stats.chi2.isf(alpha, len(cells) - 1))
    return GoodnessOfFit(statistic, critical, len(cells), smallest_p, alpha)


def _pooled_cells(observed: Mapping[K, int], law: Mapping[K, Fraction], n: int) -> list[tuple[float, int]]:
    """(probability, observed count) per cell, the outputs expected fewer than 5 times pooled."""
    outputs = sorted(law, key=lambda output: law[output])
    cells: list[tuple[float, int]] = []
    pool_p, pool_observed, i = 0.0, 0, 0
    while i < len(outputs) and (n * float(law[outputs[i]]) < 5 or 0 < n * pool_p < 5):
        pool_p += float(law[outputs[i]])
        pool_observed += observed.get(outputs[i], 0)
        i += 1
    if pool_p:
        cells.append((pool_p, pool_observed))
    return cells + [(float(law[output]), observed.get(output, 0)) for output in outputs[i:]]


# ----------------------------------------------------------------------------- the estimator


def sampled_rounds(
    randomiser: LocalRandomiser,
    truth: Sequence[int],
    rounds: int,
    *,
    batched: bool = True,
    rng: Csprng | None = None,
) -> IntArray:
    """Count cells of ``rounds`` rounds of ``truth`` via the real sampler, ``split_messages`` and
    ``tally``: the estimator's input, exactly as the aggregator builds it."""
    values = [v for v, x in enumerate(truth) for _ in range(x)]
    out = np.zeros((rounds, randomiser.count_cells), dtype=np.int64)
    for r in range(rounds):
        if batched:
            payloads = randomiser.randomise_many(values, rng)
        else:
            payloads = [randomiser.randomise(v, rng) for v in values]
        tally = randomiser.tally([m for payload in payloads for m in randomiser.split_messages(payload)])
        if tally.invalid.any():
            raise ValueError("tally rejected a payload of the randomiser itself")
        out[r] = tally.counts
    return out


@dataclass(frozen=True)
class EstimatorCheck:
    """What ``check_estimator`` measured per bucket, and the acceptance region of each check."""

    truth: FloatArray
    mean: FloatArray
    mean_tolerance: FloatArray
    variance: FloatArray
    variance_ratio: FloatArray
    variance_ratio_bounds: tuple[float, float]
    covered: IntArray
    coverage_bounds: tuple[int, int]
    rounds: int

    @property
    def failures(self) -> list[str]:
        """One line per family of checks that some bucket failed; empty if the estimator passed."""
        out = []
        if not np.all(np.abs(self.mean - self.truth) <= self.mean_tolerance):
            out.append(f"biased: mean {self.mean.tolist()} vs truth {self.truth.tolist()}")
        lo, hi = self.variance_ratio_bounds
        if not np.all((lo <= self.variance_ratio) & (self.variance_ratio <= hi)):
            out.append(f"variance: s^2 / variance {self.variance_ratio.tolist()} outside [{lo}, {hi}]")
        cov_lo, cov_hi = self.coverage_bounds
        if not np.all((cov_lo <= self.covered) & (self.covered <= cov_hi)):
            coverage = (self.covered / self.rounds).tolist()
            out.append(f"coverage {coverage} outside [{cov_lo}, {cov_hi}] of {self.rounds} rounds")
        return out

    @property
    def passed(self) -> bool:
        """True if every bucket passed the mean, variance and coverage checks."""
        return not self.failures


def check_estimator(
    randomiser: LocalRandomiser,
    truth: Sequence[int],
    counts: IntArray,
    *,
    alpha: float = 1e-6,
    confidence: float = 0.95,
) -> EstimatorCheck:
    """Mean, variance and CI coverage of ``estimate`` over rounds: unbiased, with the variance it states?"""
    # counts: one row of count cells per independent round of the population ``truth``. Three
    # families of two-sided per-bucket checks share the false-failure rate alpha (Bonferroni,
    # alpha / (3 d) each; no independence between buckets is needed):
    # - mean: |mean - truth| <= z sqrt(variance / R), the normal approximation to a mean of R n
    #   independent bounded terms;
    # - variance: (R - 1) s^2 / variance inside the chi-square(R - 1) central interval, exact for
    #   normal estimates. Estimates affine in sums of n Bernoulli terms have excess kurtosis
    #   kappa = O(1/n), and Var(s^2) = sigma^4 (2 / (R - 1) + kappa / R): the interval is off by a
    #   relative kappa / 2 = O(1/n), negligible at n >= 2000;
    # - coverage: the rounds whose CI holds the truth lie in the exact Binomial(R, confidence)
    #   central interval; this presumes the normal CI's actual coverage is within a few
    #   thousandths of nominal at the n used (the binomial band is about +-0.02 at R = 4000).
    from scipy import stats

    d, rounds, n = len(truth), counts.shape[0], int(sum(truth))
    if d != randomiser.domain_size:
        raise ValueError(f"truth has {d} buckets, the randomiser {randomiser.domain_size}")
    level = alpha / (3 * d)
    truth_array = np.asarray(truth, dtype=np.float64)
    estimates = np.empty((rounds, d))
    covered = np.zeros(d, dtype=np.int64)
    for r in range(rounds):
        rows = randomiser.estimate([int(c) for c in counts[r]], n, confidence)
        estimates[r] = [row.estimate for row in rows]
        covered += np.array([row.ci_low <= x <= row.ci_high for row, x in zip(rows, truth, strict=True)])
    variance = randomiser.variance(truth_array, n)
    z = float(stats.norm.isf(level / 2))
    return EstimatorCheck(
        truth=truth_array,
        mean=estimates.mean(axis=0),
        mean_tolerance=z * np.sqrt(variance / rounds),
        variance=variance,
        variance_ratio=estimates.var(axis=0, ddof=1) / variance,
        variance_ratio_bounds=(
            float(stats.chi2.ppf(level / 2, rounds - 1)) / (rounds - 1),
            float(stats.chi2.isf(level / 2, rounds - 1)) / (rounds - 1),
        ),
        covered=covered,
        coverage_bounds=(
            int(stats.binom.ppf(level / 2, rounds, confidence)),
            int(stats.binom.isf(level / 2, rounds, confidence)),
        ),
        rounds=rounds,
    )


# =========================================================================== timing

TIMING_BOUND = 0.2
TIMING_TOLERANCE = 0.10


def timing_distance(a: FloatArray, b: FloatArray, tolerance: float = TIMING_TOLERANCE) -> float:
    """How far apart two samples of call times are, ignoring a slow-down of either up to ``tolerance``.

    max over t of F_a(t / (1 + tol)) − F_b(t) and F_b(t / (1 + tol)) − F_a(t), clipped at 0
    (a Lévy-style distance): zero when one sample is the other slowed by at most the
    tolerance, the two-sample Kolmogorov–Smirnov statistic when the tolerance is 0. The best
    threshold classifier on one call's time is right with probability at most (1 + distance) / 2
    beyond that slack. The step functions jump at the (scaled) sample points, so the maximum is
    attained on that grid.
    """
    stretch = 1.0 + tolerance
    sorted_a, sorted_b = np.sort(np.asarray(a, dtype=np.float64)), np.sort(np.asarray(b, dtype=np.float64))
    grid = np.concatenate([sorted_a, sorted_b, sorted_a * stretch, sorted_b * stretch])

    def cdf(sample: FloatArray, points: FloatArray) -> FloatArray:
        return np.searchsorted(sample, points, side="right") / len(sample)

    a_ahead = cdf(sorted_a, grid / stretch) - cdf(sorted_b, grid)
    b_ahead = cdf(sorted_b, grid / stretch) - cdf(sorted_a, grid)
    return float(max(0.0, float(a_ahead.max()), float(b_ahead.max())))


def interleaved_durations(
    call_a: Callable[[], object], call_b: Callable[[], object], blocks: int = 40, per_block: int = 100
) -> tuple[FloatArray, FloatArray]:
    """Per-call times of two calls, each divided by the median of its block pair.

    Blocks of the two calls alternate, and so does which goes first (the second in a pair is
    measurably slower); dividing by the pair's median cancels load drift on a shared machine.
    """
    import time

    clock = time.perf_counter_ns
    for _ in range(50):  # warm-up
        call_a(), call_b()
    out: tuple[list[FloatArray], list[FloatArray]] = ([], [])
    for block in range(blocks):
        pair: list[FloatArray] = [np.empty(per_block), np.empty(per_block)]
        for which in (0, 1) if block % 2 == 0 else (1, 0):
            call, durations = (call_a, call_b)[which], pair[which]
            for k in range(per_block):
                start = clock()
                call()
                durations[k] = clock() - start
        scale = float(np.median(np.concatenate(pair)))
        out[0].append(pair[0] / scale)
        out[1].append(pair[1] / scale)
    return np.concatenate(out[0]), np.concatenate(out[1])


def timing_separation(
    call_a: Callable[[], object],
    call_b: Callable[[], object],
    *,
    attempts: int = 3,
    bound: float = TIMING_BOUND,
    tolerance: float = TIMING_TOLERANCE,
) -> float:
    """Does running time tell two calls apart? The smallest ``timing_distance`` over up to
    ``attempts`` measurements of 4,000 calls each, stopping at the first within ``bound``.

    A result above ``bound`` says the calls are separable. For equal-time calls one
    measurement exceeds 0.2 with probability far below 1e-6 (KS critical value ≈ 0.06 at 1e-6
    for 4,000 + 4,000 samples); scheduler bursts are not independent noise, hence the retries.
    The 10% tolerance absorbs CPython's own value-dependent costs (an int outside the small-int
    cache costs an allocation: a few percent of a 1.5 µs call, which alone gave a plain KS
    distance of 0.23 on a quiet machine); a branch that does a quarter more work on one side is
    still separated (tested).
    """
    best = 1.0
    for _ in range(attempts):
        best = min(best, timing_distance(*interleaved_durations(call_a, call_b), tolerance))
        if best <= bound:
            break
    return best
