"""Statistical privacy audit of a randomiser: a sound lower bound on its empirical epsilon.

External auditors (and our tests) sample ``randomise`` on two inputs, group outputs into events
fixed in advance (``event_of``: any function of the payload, e.g. "bit j of a unary encoding",
which is post-processing and so keeps the bound sound), and compute one-sided Clopper–Pearson
bounds for every event in both directions, Bonferroni-corrected. With probability at least
1 - alpha every bound holds, and then the returned value is at most the true epsilon: a result
above the claimed epsilon0 is evidence, at level alpha, that the claim is false.

Needs scipy (installed with the ``dev`` extra).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from deniable.core.mechanisms.base import LocalRandomiser
from deniable.core.rng import Csprng


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
            low = clopper_pearson_lower(top, top_n, level)
            if low > 0:
                best = max(best, math.log(low / clopper_pearson_upper(bottom, bottom_n, level)))
    return best


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
