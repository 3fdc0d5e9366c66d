"""The privacy planner: from a central target (epsilon, delta) at n to a mechanism and its epsilon0.

For each registered mechanism that accepts the domain, a bracketed search finds the largest
epsilon0 whose ``central_guarantee(n, delta)`` is at most the target (the returned value is always
one that was checked), then ranks the mechanisms by the expected standard error of one bucket's
count at n under a uniform truth (n/k per bucket). The trusted-curator Laplace baseline at the
same (epsilon, delta) uses replace-one neighbours, as the shuffle analyses do.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

from deniable.core import mechanisms as registry
from deniable.core.accounting.accountant import best_bound
from deniable.core.campaigns import layout_for

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np


# Largest epsilon0 the planner proposes (the aggregator refuses campaigns above it).
MAX_PLANNED_EPSILON0: Final = 20.0
MAX_N: Final = 10**9
"""Largest shuffle (reports per batch) the planner and the accountant accept: bounded cost and memory."""
MAX_DOMAIN: Final = 4096
"""Largest domain they accept (a campaign has at most this many labels)."""
# The search stops when its bracket [feasible, infeasible] is narrower than this, relative.
RELATIVE_TOLERANCE: Final = 1e-4
# How far below the target the search looks for a feasible epsilon0 before giving up.
SMALLEST_FRACTION: Final = 2.0**-12
MAX_EVALUATIONS: Final = 80
# A returned central epsilon this far (in log) below the target means the guarantee jumped.
JUMP_GAP: Final = 0.01

TRUTH_ASSUMPTION: Final = (
    "uniform truth (n/k reports per bucket); error = sqrt(mean over buckets of variance + bias^2),"
    " the std error for unbiased estimators"
)
NEIGHBOURING: Final = "replace-one (one device changes its value, n fixed), as in the shuffle analyses"


@dataclass(frozen=True)
class DeviceBudget:
    """What one device may send: sealed bytes and messages (means, as ``device_cost`` gives them)."""

    max_bytes: float = 4096.0
    max_messages: float = 16.0

    def fits(self, candidate: Candidate) -> bool:
        """True when the candidate's mean cost is within the budget (unknown cost: fits)."""
        over_bytes = candidate.bytes_per_device > self.max_bytes
        return not (over_bytes or candidate.messages_per_device > self.max_messages)


class PlanningError(ValueError):
    """No registered mechanism (or not the requested one) meets the target at this n."""


@dataclass(frozen=True)
class Candidate:
    """One mechanism's best configuration for the target, or why it has none."""

    mechanism: str
    feasible: bool
    epsilon0: float = math.nan
    params: dict[str, float] = field(default_factory=dict)
    central_epsilon: float = math.nan
    delta: float = math.nan
    analysis: str = ""
    amplified: bool = False
    local_privacy: bool = True
    expected_std_error: float = math.inf
    evaluations: int = 0
    note: str = ""
    messages_per_device: float = math.nan  # mean messages one device sends (exact where fixed)
    bytes_per_device: float = math.nan  # those messages sealed: mean bytes one device sends

    @property
    def local_epsilon(self) -> float | None:
        """The local guarantee a device keeps whoever misbehaves: epsilon0, or None (shuffle-only)."""
        return self.epsilon0 if self.local_privacy and self.feasible else None


@dataclass(frozen=True)
class LaplaceBaseline:
    """Central Laplace (trusted curator) on the true counts: the accuracy shuffling is compared to."""

    epsilon: float
    delta: float
    sensitivity: float
    scale: float
    std_error: float
    neighbouring: str = NEIGHBOURING
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """The chosen mechanism and epsilon0 for a central target, with every candidate considered."""

    target_epsilon: float
    delta: float
    n: int
    domain_size: int
    mechanism: str
    epsilon0: float
    params: dict[str, float]
    central_epsilon: float
    analysis: str
    expected_std_error: float
    candidates: tuple[Candidate, ...]
    central_laplace: LaplaceBaseline
    truth_assumption: str = TRUTH_ASSUMPTION
    require_local_dp: bool = False

    @property
    def chosen(self) -> Candidate:
        """The candidate row of the chosen mechanism."""
        return next(c for c in self.candidates if c.mechanism == self.mechanism and c.feasible)

    @property
    def local_alternative(self) -> Candidate | None:
        """When the chosen mechanism has no local guarantee: the best feasible local randomiser."""
        if self.chosen.local_privacy:
            return None
        local = [c for c in self.candidates if c.feasible and c.local_privacy]
        return min(local, key=lambda c: c.expected_std_error) if local else None

    @property
    def ratio_to_central(self) -> float:
        """Expected std error of the chosen protocol over the central Laplace one."""
        return self.expected_std_error / self.central_laplace.std_error

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``epsilon`` is the central epsilon achieved at n)."""
        return {
            "epsilon": self.central_epsilon,
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "n": self.n,
            "domain_size": self.domain_size,
            "analysis": self.analysis,
            "mechanism": self.mechanism,
            "epsilon0": self.epsilon0,
            "params": dict(self.params),
            "expected_std_error": self.expected_std_error,
            "truth_assumption": self.truth_assumption,
            "central_laplace": asdict(self.central_laplace),
            "ratio_to_central_laplace": self.ratio_to_central,
            "candidates": [_json_candidate(c) for c in self.candidates],
            "local_guarantee": self.chosen.local_privacy,
            "local_epsilon": self.chosen.local_epsilon,
            "require_local_dp": self.require_local_dp,
            "local_alternative": self._alternative_json(),
        }

    def _alternative_json(self) -> dict[str, Any] | None:
        alternative = self.local_alternative
        if alternative is None:
            return None
        return {
            "mechanism": alternative.mechanism,
            "local_epsilon": alternative.epsilon0,
            "expected_std_error": alternative.expected_std_error,
            "error_ratio_to_chosen": alternative.expected_std_error / self.expected_std_error,
        }


def _json_candidate(candidate: Candidate) -> dict[str, Any]:
    row = asdict(candidate)
    row["local_epsilon"] = candidate.local_epsilon
    for key, value in row.items():
        if isinstance(value, float) and not math.isfinite(value):
            row[key] = None
    return row


def _check_target(target_epsilon: float, delta: float, n: int, domain_size: int) -> None:
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target epsilon must be a positive finite number, got {target_epsilon!r}")
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if isinstance(domain_size, bool) or int(domain_size) != domain_size or domain_size < 2:
        raise ValueError(f"domain size must be an integer >= 2, got {domain_size!r}")


def central_laplace(epsilon: float, delta: float, domain_size: int) -> LaplaceBaseline:
    """Std error of one count under Laplace noise, replace-one neighbours (pure epsilon-DP).

    k = 2: the yes count alone changes by at most 1 (sensitivity 1; "no" is n minus it).
    k >= 3: one device moves one unit between two counts, L1 sensitivity 2. Scale b = sensitivity /
    epsilon, std error sqrt(2) b. delta is not used (Laplace is (epsilon, 0)-DP).
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if domain_size < 2:
        raise ValueError(f"domain size must be at least 2, got {domain_size}")
    sensitivity = 1.0 if domain_size == 2 else 2.0
    scale = sensitivity / epsilon
    what = "the yes count (no = n - yes)" if domain_size == 2 else "the histogram of k counts"
    return LaplaceBaseline(
        epsilon=epsilon,
        delta=delta,
        sensitivity=sensitivity,
        scale=scale,
        std_error=math.sqrt(2.0) * scale,
        note=f"Laplace({scale:.4g}) on {what}; L1 sensitivity {sensitivity:g}; pure epsilon-DP, delta unused",
    )


def expected_bias(randomiser: Any, truth: Any, n: int) -> Any:
    """The estimator's bias per bucket if the mechanism reports one (thresholding ones), else None."""
    bias = getattr(randomiser, "bias", None)
    if not callable(bias):
        return None
    try:
        values = bias(truth, n)
    except TypeError:  # bias(true_counts) without n
        values = bias(truth)
    return np.asarray(values, dtype=np.float64)


def expected_std_error(randomiser: Any, n: int) -> float:
    """RMS over buckets of the estimator's error at n under a uniform truth (n/k per bucket).

    The exact ``variance``, plus the squared ``bias`` for mechanisms that report one (estimators
    that threshold or suppress are biased): for unbiased estimators this is the std error.
    """
    k = int(randomiser.domain_size)
    truth = np.full(k, n / k, dtype=np.float64)
    mse = np.asarray(randomiser.variance(truth, n), dtype=np.float64)
    bias = expected_bias(randomiser, truth, n)
    if bias is not None:
        mse = mse + bias * bias
    return float(math.sqrt(max(float(np.mean(mse)), 0.0)))


def applicable(
    name: str, domain_size: int, params: Mapping[str, float] | None = None, epsilon0: float = 1.0
) -> str | None:
    """None when the mechanism accepts this domain (at epsilon0 or 1), else the reason it does not."""
    reason = None
    for trial in dict.fromkeys((min(epsilon0, MAX_PLANNED_EPSILON0), 1.0)):
        try:
            registry.create(name, epsilon0=trial, domain_size=domain_size, **dict(params or {}))
        except ValueError as exc:
            reason = reason or str(exc)
        else:
            return None
    return reason


class _Search:
    """Memoised feasibility of epsilon0 for one (mechanism, target, delta, n, domain)."""

    def __init__(
        self, name: str, target: float, delta: float, n: int, k: int, params: Mapping[str, float]
    ) -> None:
        self.name, self.target, self.delta, self.n, self.k = name, target, delta, n, k
        self.params = dict(params)
        self.seen: dict[float, tuple[bool, float, Any, Any]] = {}
        self.refusal = ""  # the last constructor's reason for refusing an epsilon0

    def __call__(self, epsilon0: float) -> tuple[bool, float]:
        """(meets the target, log(central / target) or nan)."""
        return self.full(epsilon0)[:2]

    def full(self, epsilon0: float) -> tuple[bool, float, Any, Any]:
        """(meets the target, log gap, randomiser or None, bound or None)."""
        if epsilon0 in self.seen:
            return self.seen[epsilon0]
        result: tuple[bool, float, Any, Any]
        try:
            randomiser = registry.create(self.name, epsilon0=epsilon0, domain_size=self.k, **self.params)
            bound = randomiser.central_guarantee(self.n, self.delta)
        except ValueError as exc:
            self.refusal = str(exc)
            result = (False, math.nan, None, None)
        else:
            result = (
                _meets(bound.epsilon, bound.delta, self.target, self.delta),
                _gap(bound.epsilon, self.target),
                randomiser,
                bound,
            )
        self.seen[epsilon0] = result
        return result


def _meets(epsilon: float, delta: float, target: float, target_delta: float) -> bool:
    return math.isfinite(epsilon) and epsilon <= target and delta <= target_delta


def _gap(epsilon: float, target: float) -> float:
    return math.log(epsilon / target) if 0 < epsilon < math.inf else math.nan


Evaluate = Callable[[float], tuple[bool, float]]


def _bracket(evaluate: Evaluate, start: float, cap: float, floor: float) -> tuple[float, float] | None:
    """(lo feasible, hi infeasible or cap itself when cap is feasible); None when nothing is feasible.

    From ``start`` halve down to ``floor`` until feasible, then step up by secant extrapolation of
    the log gap (overshooting a little; doubling without two values) until infeasible.
    """
    lo = start
    while not evaluate(lo)[0]:
        lo /= 2
        if lo < floor:
            return None
    previous: float | None = None
    while lo < cap:
        g_lo = evaluate(lo)[1]
        step = 2 * lo
        if previous is not None and math.isfinite(g_lo):
            g_prev = evaluate(previous)[1]
            if math.isfinite(g_prev) and g_lo > g_prev:
                root = lo + (lo - previous) * (-g_lo) / (g_lo - g_prev)
                step = min(max(lo + 1.15 * (root - lo), lo * 1.05), 4 * lo)
        hi = min(step, cap)
        if not evaluate(hi)[0]:
            return lo, hi
        previous, lo = lo, hi
    return cap, cap


def _refine(evaluate: Evaluate, lo: float, hi: float, limit: Callable[[], bool]) -> float:
    """Narrow [lo feasible, hi infeasible] to RELATIVE_TOLERANCE: Illinois false position, nudged
    towards the side not moved last (so the bracket closes), bisection when values are missing."""
    weights = [1.0, 1.0]
    last_side = 0
    while hi - lo > RELATIVE_TOLERANCE * lo and not limit():
        if evaluate(lo)[1] == 0.0:  # exactly on the target: a larger epsilon0 can only exceed it
            break
        g_lo, g_hi = evaluate(lo)[1] * weights[0], evaluate(hi)[1] * weights[1]
        x = 0.5 * (lo + hi)
        if math.isfinite(g_lo) and math.isfinite(g_hi) and g_hi > 0 > g_lo:
            x = lo + (hi - lo) * (-g_lo) / (g_hi - g_lo)
            nudge = 0.45 * RELATIVE_TOLERANCE * lo
            x += nudge if last_side == 1 else -nudge if last_side == 2 else 0.0
            if not lo < x < hi:
                x = 0.5 * (lo + hi)
        side = 1 if evaluate(x)[0] else 2
        if side == 1:
            lo = x
        else:
            hi = x
        if side == last_side:
            weights[2 - side] *= 0.5
        else:
            weights = [1.0, 1.0]
        last_side = side
    return lo


def largest_epsilon0(
    name: str,
    target_epsilon: float,
    delta: float,
    n: int,
    domain_size: int,
    params: Mapping[str, float] | None = None,
) -> Candidate:
    """Largest epsilon0 (to RELATIVE_TOLERANCE) whose central guarantee at n meets the target.

    Brackets [lo feasible, hi infeasible] and narrows it (``_bracket``, ``_refine``); the answer
    is lo, whose guarantee was computed and checked. Assumes the guarantee grows with epsilon0.
    For LDP randomisers the search starts where the generic accountant (any epsilon0-LDP
    randomiser, cheap) meets the target: the mechanism's own guarantee is normally no larger.
    """
    _check_target(target_epsilon, delta, n, domain_size)
    return _largest_epsilon0(
        name, float(target_epsilon), float(delta), int(n), int(domain_size), _freeze(params)
    )


def _freeze(params: Mapping[str, float] | None) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((str(k), float(v)) for k, v in (params or {}).items()))


def _generic_start(target: float, delta: float, n: int, cap: float) -> float:
    """Largest epsilon0 the generic accountant (any epsilon0-LDP randomiser) certifies for the target."""
    seen: dict[float, tuple[bool, float]] = {}

    def generic(epsilon0: float) -> tuple[bool, float]:
        if epsilon0 not in seen:
            bound = best_bound(epsilon0, n, delta)
            seen[epsilon0] = (_meets(bound.epsilon, bound.delta, target, delta), _gap(bound.epsilon, target))
        return seen[epsilon0]

    bracket = _bracket(generic, min(target, cap), cap, target * SMALLEST_FRACTION)
    if bracket is None:
        return min(target, cap)
    lo, hi = bracket
    return lo if lo == hi else _refine(generic, lo, hi, lambda: len(seen) > MAX_EVALUATIONS)


@functools.lru_cache(maxsize=1024)
def _largest_epsilon0(
    name: str, target: float, delta: float, n: int, k: int, frozen: tuple[tuple[str, float], ...]
) -> Candidate:
    reason = applicable(name, k, dict(frozen), target)
    if reason is not None:
        return Candidate(mechanism=name, feasible=False, note=f"not applicable: {reason}")
    search = _Search(name, target, delta, n, k, dict(frozen))
    cap = MAX_PLANNED_EPSILON0
    start = min(target, cap)
    if not registry.mechanism_class(name).local_privacy:
        if search(start)[0]:  # shuffle-only: epsilon0 is the central target, not a local knob
            return _candidate(name, search, start, n, "shuffle-only protocol: epsilon0 is the central target")
    else:
        start = _generic_start(target, delta, n, cap)
    bracket = _bracket(search, start, cap, target * SMALLEST_FRACTION)
    if bracket is None:
        return Candidate(
            mechanism=name,
            feasible=False,
            evaluations=len(search.seen),
            note=f"no epsilon0 >= {target * SMALLEST_FRACTION:.3g} gives central epsilon <= {target:g}"
            f" at n={n}, delta={delta:g}" + (f" ({search.refusal})" if search.refusal else ""),
        )
    lo, hi = bracket
    if lo == hi:
        return _candidate(name, search, lo, n, "capped at the largest epsilon0 the planner proposes")
    epsilon0 = _refine(search, lo, hi, lambda: len(search.seen) >= MAX_EVALUATIONS)
    note = ""
    if search(epsilon0)[1] < -JUMP_GAP:
        note = (
            "the guarantee jumps above the target just beyond this epsilon0"
            " (an analysis stops applying there): largest epsilon0 below the jump"
        )
    return _candidate(name, search, epsilon0, n, note)


def _candidate(name: str, search: _Search, epsilon0: float, n: int, note: str) -> Candidate:
    ok, _, randomiser, bound = search.full(epsilon0)
    if not ok:  # the final check: never return an epsilon0 whose guarantee was not computed to fit
        raise AssertionError(f"planner bracket lost feasibility for {name} at epsilon0={epsilon0!r}")
    return Candidate(
        mechanism=name,
        feasible=True,
        epsilon0=epsilon0,
        params=dict(randomiser.parameters()),
        central_epsilon=float(bound.epsilon),
        delta=float(bound.delta),
        analysis=str(bound.analysis),
        amplified=bool(bound.amplified),
        local_privacy=bool(randomiser.local_privacy),
        expected_std_error=expected_std_error(randomiser, n),
        evaluations=len(search.seen),
        note=note,
        **device_cost(randomiser),
    )


def device_cost(randomiser: Any) -> dict[str, float]:
    """Mean messages per device and the bytes they take sealed (fixed-length HPKE ciphertexts)."""
    fixed = randomiser.messages_per_device
    messages = float(fixed if fixed is not None else getattr(randomiser, "expected_messages", 1.0))
    return {
        "messages_per_device": messages,
        "bytes_per_device": messages * layout_for(randomiser).ciphertext_length,
    }


def plan(
    target_epsilon: float,
    delta: float,
    n: int,
    domain_size: int,
    mechanisms: Iterable[str] | None = None,
    params: Mapping[str, float] | None = None,
    require_local_dp: bool = False,
    budget: DeviceBudget | None = None,
) -> Plan:
    """Every candidate's largest epsilon0 meeting the target at n; the smallest std error WITHIN the
    per-device budget wins (``budget``: default 4 kB sealed and 16 messages per device; a candidate
    over it is chosen only when none fits). docs/planner.md, ADR 0035.

    ``mechanisms`` limits the candidates (default: every registered one); ``params`` fixes
    mechanism parameters (only sensible with one mechanism); ``require_local_dp`` keeps only local
    randomisers (a device keeps epsilon0 whoever misbehaves). PlanningError when none qualifies.
    """
    _check_target(target_epsilon, delta, n, domain_size)
    names = list(mechanisms) if mechanisms is not None else registry.names()
    for name in names:
        registry.mechanism_class(name)  # ValueError naming the known ones
    if require_local_dp:
        names = [name for name in names if registry.mechanism_class(name).local_privacy]
    candidates = [best_configuration(name, target_epsilon, delta, n, domain_size, params) for name in names]
    limit = budget or DeviceBudget()
    ranked = sorted(
        candidates, key=lambda c: (not c.feasible, not limit.fits(c), c.expected_std_error, c.mechanism)
    )
    best = ranked[0] if ranked else None
    if best is None or not best.feasible:
        reasons = "; ".join(f"{c.mechanism}: {c.note}" for c in candidates) or "no mechanism given"
        raise PlanningError(
            f"no mechanism reaches central epsilon <= {target_epsilon:g} at delta={delta:g},"
            f" n={n}, k={domain_size} ({reasons})"
        )
    return Plan(
        target_epsilon=float(target_epsilon),
        delta=float(delta),
        n=int(n),
        domain_size=int(domain_size),
        mechanism=best.mechanism,
        epsilon0=best.epsilon0,
        params=dict(best.params),
        central_epsilon=best.central_epsilon,
        analysis=best.analysis,
        expected_std_error=best.expected_std_error,
        candidates=tuple(ranked),
        central_laplace=central_laplace(float(target_epsilon), float(delta), int(domain_size)),
        require_local_dp=require_local_dp,
    )


def parameter_sets(
    name: str, target_epsilon: float, delta: float, n: int, domain_size: int
) -> list[dict[str, float]]:
    """Parameter sets to try: the mechanism's optional ``planning_parameters`` hook, else defaults.

    A mechanism whose accuracy depends on parameters beyond epsilon0 (a sample rate, say) may
    define ``planning_parameters(target_epsilon, delta, n, domain_size)`` as a classmethod
    returning candidate parameter dicts; the planner keeps the one with the smallest error. An
    empty list from the hook means no parameters meet the target: it is returned as it is (the
    defaults are not tried) and ``best_configuration`` lists the mechanism as infeasible.
    """
    context = context_parameters(name, n, delta)
    hook = getattr(registry.mechanism_class(name), "planning_parameters", None)
    if not callable(hook):
        return [context]
    return [
        {**context, **{str(k): float(v) for k, v in p.items()}}
        for p in hook(target_epsilon, delta, n, domain_size)
    ]


def context_parameters(name: str, n: int, delta: float) -> dict[str, float]:
    """``expected_n`` and ``delta`` for mechanisms whose constructor takes them (shuffle-only protocols)."""
    accepted = inspect.signature(registry.mechanism_class(name)).parameters
    context = {"expected_n": float(n), "delta": float(delta)}
    return {key: value for key, value in context.items() if key in accepted}


def best_configuration(
    name: str,
    target_epsilon: float,
    delta: float,
    n: int,
    domain_size: int,
    params: Mapping[str, float] | None = None,
) -> Candidate:
    """``largest_epsilon0`` for the given params, or for each planning parameter set (least error)."""
    if params:
        sets = [{**context_parameters(name, n, delta), **params}]
    else:
        sets = parameter_sets(name, target_epsilon, delta, n, domain_size)
        if not sets:
            return Candidate(
                mechanism=name,
                feasible=False,
                note=f"no parameters meet central epsilon <= {target_epsilon:g} at delta={delta:g},"
                f" n={n} (its planning_parameters proposes none)",
            )
    tried = [largest_epsilon0(name, target_epsilon, delta, n, domain_size, p) for p in sets]
    return min(tried, key=lambda c: (not c.feasible, c.expected_std_error))


def clear_cache() -> None:
    """Forget planned candidates (tests, or after a mechanism's analysis changed)."""
    _largest_epsilon0.cache_clear()
