"""One contract every registered local randomiser keeps, parametrised over the registry.

A new mechanism module is registered by ``deniable.core.mechanisms`` on import and lands in
``INSTANCES`` below without a test file of its own: it must build from (epsilon0, domain_size)
plus, where its signature asks for one, ``expected_n``. Mechanism files keep only what is truly
theirs (draw maps, hash families, thresholds, mutants the audit must catch).

Statistical checks state their false-failure rate: ``ALPHA`` per assertion, listed in each
test's docstring. Default-run sizes keep the suite to a few seconds.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from support.stats import exp_interval, law_worst_ratio

from deniable.core import mechanisms
from deniable.core.audit import audit, check_estimator, chi_square_fit, sampled_rounds
from deniable.core.mechanisms import LocalRandomiser
from deniable.core.mechanisms.exact import exp_lower_bound
from deniable.core.rng import Csprng, default_rng

ALPHA = 1e-6  # false-failure rate of each statistical assertion in this file
EXPECTED_N = 1000.0  # the population size shuffle-only protocols are calibrated for
# Unary encodings' randomise_many reads 56 more bits only on a top-byte tie, so its consumption
# varies by design (test_unary checks it maps draws to bits exactly as randomise does).
LAZY_BATCH = {"sue", "oue"}
BAD_VALUES: tuple[object, ...] = (-1, 2**70, 1.0, 0.5, "0", None, b"\x00")


@functools.cache
def _create(
    name: str, epsilon0: float, domain_size: int, params: tuple[tuple[str, Any], ...]
) -> LocalRandomiser:
    """One randomiser per parameter point for the whole file: randomisers hold no state between
    calls, and building some (flooded_histogram at eps0 0.5: an exact profile search, ~15 s) is
    the slowest step of several contract tests."""
    return mechanisms.create(name, epsilon0=epsilon0, domain_size=domain_size, **dict(params))


@dataclass(frozen=True, eq=False)
class Instance:
    """One registered mechanism at one parameter point."""

    name: str
    epsilon0: float
    domain_size: int
    params: dict[str, Any] = field(default_factory=dict)
    samples: int = 20_000  # reports per value through randomise_many (and the audit)
    scalar: int = 5_000  # reports per value through randomise (one call each: slower)

    def build(self) -> LocalRandomiser:
        """The randomiser, through the registry as the services build it (built once per point)."""
        return _create(self.name, self.epsilon0, self.domain_size, tuple(sorted(self.params.items())))

    @property
    def id(self) -> str:
        """Readable test id: name, epsilon and domain size."""
        extra = "".join(f"-{k}{v}" for k, v in self.params.items() if k != "expected_n")
        return f"{self.name}-eps{self.epsilon0}-d{self.domain_size}{extra}-n{self.samples}-s{self.scalar}"


def default_instance(name: str, epsilon0: float) -> Instance:
    """A small instance of ``name``: its default domain size (else 4), ``expected_n`` if it takes one."""
    signature = inspect.signature(mechanisms.mechanism_class(name))
    domain = signature.parameters["domain_size"].default
    params = {"expected_n": EXPECTED_N} if "expected_n" in signature.parameters else {}
    return Instance(name, epsilon0, 4 if domain is inspect.Parameter.empty else int(domain), params)


REGISTERED = mechanisms.names()
DEFAULT_INSTANCES = [default_instance(name, eps) for name in REGISTERED for eps in (0.5, 1.0, 4.0)]
EPSILONS = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0)

# Parameter points the per-mechanism files checked the same properties at, kept so that no checked
# point is lost: exact laws and ratios of direct encodings, ...
DIRECT = [
    *[Instance("binary_rr", eps, 2) for eps in EPSILONS],
    *[Instance("grr", eps, k) for eps in EPSILONS for k in (2, 3, 8, 100)],
]
INSTANCES = [*DEFAULT_INSTANCES, *DIRECT]
# ... out-of-domain values, ...
DOMAIN_INSTANCES = [
    *DEFAULT_INSTANCES,
    *[Instance("grr", 1.0, k) for k in (3, 8, 300)],
    Instance("hadamard_response", 1.0, 10),
    Instance("olh", 1.0, 10, {"g": 3}),
]
# ... randomness consumed whatever the value, ...
CONSUMED_INSTANCES = [
    *DEFAULT_INSTANCES,
    *[Instance("grr", 1.0, k) for k in (3, 8, 100)],
    Instance("hadamard_response", 1.0, 100),
    Instance("olh", 1.0, 100, {"g": 5}),
    *[Instance(n, 1.0, 11) for n in ("sue", "oue")],
    Instance("subset_selection", 1.0, 11, {"subset_size": 4}),
]
# ... the statistical checks at the registry's defaults (eps0 = 1) and at the points (and sample
# sizes: reports per value) the per-mechanism files checked them at.
SUBSET = "subset_selection"
GOF_INSTANCES = [
    *[default_instance(name, 1.0) for name in REGISTERED],
    *[
        Instance("binary_rr", eps, 2, samples=n, scalar=n)
        for eps, n in ((0.5, 100_000), (1.0, 100_000), (8.0, 200_000))
    ],
    *[
        Instance("grr", eps, k, samples=100_000, scalar=100_000)
        for eps, k in ((1.0, 3), (2.0, 8), (4.0, 100))
    ],
    *[Instance("hadamard_response", eps, d, scalar=n) for eps, d, n in ((1.0, 5, 20_000), (4.0, 12, 30_000))],
    *[
        Instance("hadamard_response", eps, d, samples=n)
        for eps, d, n in ((0.5, 3, 200_000), (2.0, 31, 200_000))
    ],
    Instance("hadamard_response", 4.0, 100, samples=400_000),
    *[Instance("olh", eps, d, {"g": g}, scalar=20_000) for eps, g, d in ((1.0, 3, 10), (0.5, 8, 10))],
    *[
        Instance("olh", eps, d, {"g": g}, samples=200_000)
        for eps, g, d in ((2.0, 4, 17), (0.5, 9, 12), (4.0, 5, 7))
    ],
    *[
        Instance(n, eps, d, samples=300_000, scalar=30_000)
        for n in ("sue", "oue")
        for eps, d in ((1.0, 5), (4.0, 3))
    ],
    *[Instance(n, 2.0, 9, samples=300_000) for n in ("sue", "oue")],
    *[Instance(SUBSET, e, d, {"subset_size": w}, 200_000, 20_000) for e, d, w in ((1.0, 5, 2), (0.5, 6, 3))],
    *[Instance(SUBSET, e, d, {"subset_size": w}, samples=200_000) for e, d, w in ((2.0, 9, 4), (4.0, 12, 3))],
]
AUDIT_INSTANCES = [
    *[default_instance(name, 1.0) for name in REGISTERED],
    *[Instance("binary_rr", eps, 2, samples=100_000) for eps in (0.5, 1.0, 4.0)],
    *[Instance("grr", eps, k, samples=100_000) for eps, k in ((1.0, 3), (2.0, 8))],
    *[
        Instance("hadamard_response", e, d, samples=100_000)
        for e, d in ((0.5, 3), (1.0, 7), (2.0, 12), (4.0, 5))
    ],
    *[
        Instance("olh", eps, d, {"g": g}, samples=100_000)
        for eps, g, d in ((0.5, 3, 10), (1.0, 4, 17), (2.0, 8, 10), (4.0, 5, 7))
    ],
]


def instances(
    predicate: Callable[[Instance], bool] | None = None, pool: Sequence[Instance] = INSTANCES
) -> pytest.MarkDecorator:
    """The instances of ``pool`` that ``predicate`` holds for, as pytest parameters."""
    chosen = [i for i in pool if predicate is None or predicate(i)]
    return pytest.mark.parametrize("instance", chosen, ids=[i.id for i in chosen])


@functools.cache
def _law_is_finite(name: str) -> bool:
    """Whether ``name`` enumerates an exact law (not when the device's noise has infinite support)."""
    try:
        default_instance(name, 1.0).build().output_distribution(0)
    except ValueError:
        return False
    return True


def has_finite_law(instance: Instance) -> bool:
    """True if the mechanism's exact output law is finite and enumerable."""
    return _law_is_finite(instance.name)


def enumerable(instance: Instance) -> bool:
    """A finite law small enough to enumerate over every input in a default run (d <= 100, at
    most 512 outputs); larger points only serve the domain checks."""
    return has_finite_law(instance) and instance.domain_size <= 100 and _law_size(instance) <= 512


@functools.cache
def _law_size(instance: Instance) -> int:
    """How many outputs input 0 can have."""
    return len(instance.build().output_distribution(0))


def local(instance: Instance) -> bool:
    """True for mechanisms that claim epsilon0 on every single report (not shuffle-only)."""
    return bool(mechanisms.mechanism_class(instance.name).local_privacy) and enumerable(instance)


def single_message(instance: Instance) -> bool:
    """True for mechanisms whose payload is one message with a finite exact law."""
    return enumerable(instance) and instance.build().messages_per_device == 1


def laws(mech: LocalRandomiser) -> list[dict[bytes, Fraction]]:
    """The exact output law of every input value."""
    return [mech.output_distribution(v) for v in range(mech.domain_size)]


# =========================================================================== the registry


def test_every_registered_mechanism_is_in_the_suite() -> None:
    """The suite's parameters come from the registry, so a new mechanism is tested unasked."""
    assert {i.name for i in INSTANCES} == set(mechanisms.names())
    assert all(i.name in mechanisms.names() for i in INSTANCES)


# =========================================================================== exact laws


@instances(enumerable)
def test_exact_law_sums_to_one_over_payloads_of_the_stated_length(instance: Instance) -> None:
    mech = instance.build()
    for law in laws(mech):
        assert sum(law.values(), Fraction(0)) == 1
        assert all(p > 0 for p in law.values())
        if mech.messages_per_device == 1:
            assert all(len(payload) == mech.payload_length for payload in law)


@instances(local)
def test_worst_ratio_is_at_most_e_to_the_epsilon0_and_tight(instance: Instance) -> None:
    """Worst ratio over inputs and outputs <= exp_lower_bound(eps0) < e**eps0 (exact rationals),
    and within 2**-30 of e**eps0: thresholds do not throw utility away."""
    mech = instance.build()
    eps = instance.epsilon0
    ratio = law_worst_ratio(laws(mech))
    lo, _ = exp_interval(eps)
    assert ratio <= exp_lower_bound(eps) < lo  # so ratio < e**eps0 strictly, for the float eps0 given
    assert ratio >= lo * (1 - Fraction(1, 2**30)), "thresholds should not throw away utility"
    if hasattr(mech, "worst_ratio"):
        assert ratio == mech.worst_ratio  # the analytic ratio behind realised_epsilon is the true one
    if instance.domain_size <= 8 or eps == 1.0:  # realised_epsilon enumerates again: small d only
        assert eps - 1e-9 <= mech.realised_epsilon <= eps + 1e-12
        assert math.log(ratio) == pytest.approx(mech.realised_epsilon, abs=1e-12)


# =========================================================================== randomness


class CountingRng(Csprng):
    """A keyed CSPRNG that counts what is drawn from it (every draw goes through ``bytes``)."""

    def __init__(self) -> None:
        super().__init__(key=b"\x07" * 32)
        self.drawn = 0

    def bytes(self, count: int) -> bytes:
        self.drawn += count
        return super().bytes(count)


@instances(pool=DEFAULT_INSTANCES)
def test_randomise_draws_from_the_given_csprng_only(instance: Instance) -> None:
    """Two equally keyed CSPRNGs give the same payloads: no other source of randomness is read."""
    mech = instance.build()
    values = [v % mech.domain_size for v in range(40)]
    for _ in range(2):
        first, second = CountingRng(), CountingRng()
        assert [mech.randomise(v, first) for v in values] == [mech.randomise(v, second) for v in values]
        assert mech.randomise_many(values, first) == mech.randomise_many(values, second)
        assert first.drawn > 0


@instances(pool=CONSUMED_INSTANCES)
def test_randomness_consumed_does_not_depend_on_the_value(instance: Instance) -> None:
    """The same keyed CSPRNG is left in the same state whatever the values (no value-dependent
    draws, which would be a timing side channel), for ``randomise`` and ``randomise_many``."""
    mech = instance.build()
    d = mech.domain_size
    tails, many = set(), set()
    for value in sorted({0, 1 % d, d // 2, d - 1}):
        rng = Csprng(key=b"\x07" * 32)
        for _ in range(300):
            mech.randomise(value, rng)
        tails.add(rng.bytes(32))
        rng = Csprng(key=b"\x07" * 32)
        mech.randomise_many([value] * 1000, rng)
        many.add(rng.bytes(32))
    assert len(tails) == 1
    assert len(many) == 1 or instance.name in LAZY_BATCH


@pytest.mark.parametrize("name", REGISTERED)
def test_randomise_uses_the_process_csprng_when_none_is_given(name: str) -> None:
    """200 draws without an rng at eps0 = 0.5 are not one fixed stream: no output of any registered
    instance there is likelier than 0.9, so P(all equal) <= 0.9**199 < 1e-9."""
    mech = default_instance(name, 0.5).build()
    assert len({mech.randomise(0) for _ in range(200)}) > 1
    assert mech.randomise_many([]) == []
    assert default_rng() is default_rng()


# =========================================================================== the payload domain


@instances(pool=DOMAIN_INSTANCES)
def test_out_of_domain_values_raise(instance: Instance) -> None:
    """randomise, randomise_many and (where it is finite) output_distribution refuse values outside
    range(d) and values that are not ints."""
    mech = instance.build()
    finite = has_finite_law(instance)
    for bad in (*BAD_VALUES, mech.domain_size, mech.domain_size + 7):
        with pytest.raises(ValueError):
            mech.randomise(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            mech.randomise_many([0, bad])  # type: ignore[list-item]
        if finite:
            with pytest.raises(ValueError):
                mech.output_distribution(bad)  # type: ignore[arg-type]


@instances(single_message)
def test_randomise_returns_payload_length_bytes_in_the_support(instance: Instance) -> None:
    """100 payloads per value (0, 1, d // 2, d - 1), from the process and from a keyed CSPRNG."""
    mech = instance.build()
    d = mech.domain_size
    keyed = Csprng(key=b"\x01" * 32)
    for value in sorted({0, 1 % d, d // 2, d - 1}):
        support = {out for out, p in mech.output_distribution(value).items() if p > 0}
        for rng in (None, keyed):
            for _ in range(100):
                out = mech.randomise(value, rng)
                assert isinstance(out, bytes)
                assert len(out) == mech.payload_length
                assert out in support
    assert mech.randomise(True) in mech.output_distribution(1 % d)  # bool is an int


@instances(lambda i: single_message(i) and _law_size(i) * i.domain_size <= 1024)
def test_tally_counts_its_own_payloads_and_flags_malformed_ones(instance: Instance) -> None:
    mech = instance.build()
    support = sorted({payload for law in laws(mech) for payload in law})
    width = mech.payload_length
    malformed = [b"", bytes(width + 1), b"\xff" * (width + 3)]
    if width <= 2:  # every byte string of the right length outside the support
        known = set(support)
        outside = (x for i in range(256**width) if (x := i.to_bytes(width, "big")) not in known)
        malformed += list(itertools.islice(outside, 64))
    tally = mech.tally([*support, *malformed])
    assert tally.invalid.tolist() == [False] * len(support) + [True] * len(malformed)
    assert tally.valid_count == len(support)
    assert mech.tally(malformed).counts.tolist() == [0] * mech.count_cells
    assert not mech.tally(mech.randomise_many([v % mech.domain_size for v in range(50)])).invalid.any()


# =========================================================================== statistics


@instances(single_message, GOF_INSTANCES)
def test_randomise_and_randomise_many_sample_the_exact_law(instance: Instance) -> None:
    """``scalar`` reports through randomise and ``samples`` through randomise_many each fit
    ``output_distribution`` (``core.audit.chi_square_fit``)
    for inputs 0, d // 2 and d - 1; false-failure rate ALPHA per fit, so at most 6e-6 per test."""
    mech = instance.build()
    d = mech.domain_size
    for value in sorted({0, d // 2, d - 1}):
        law = mech.output_distribution(value)
        n = instance.samples  # chi_square_fit pools the outputs expected fewer than 5 times
        scalar = Counter(mech.randomise(value) for _ in range(instance.scalar))
        assert not chi_square_fit(scalar, law, ALPHA).rejects, "randomise"
        assert not chi_square_fit(Counter(mech.randomise_many([value] * n)), law, ALPHA).rejects, (
            "randomise_many"
        )


@instances(local, AUDIT_INSTANCES)
def test_audit_lower_bound_does_not_exceed_epsilon0(instance: Instance) -> None:
    """``core.audit.audit`` of inputs 0 and d - 1 with ``samples`` reports each: refutes an honest
    claim with probability at most ALPHA (the audit's own level)."""
    mech = instance.build()
    result = audit(mech, 0, mech.domain_size - 1, instance.samples, alpha=ALPHA)
    assert result.epsilon_lower_bound <= instance.epsilon0, result
    assert not result.refutes_claim


SKEWED_8 = [2500, 1000, 500, 400, 300, 200, 100, 0]
SKEWED_10 = [3500, 750, 400, 200, 100, 50, 0, 0, 0, 0]


@dataclass(frozen=True, eq=False)
class EstimatorCase:
    """A population run through the real sampler, ``rounds`` times (``batched``: randomise_many)."""

    instance: Instance
    truth: list[int]
    rounds: int
    batched: bool = True


def estimator_case(name: str) -> EstimatorCase:
    """The point the per-mechanism files checked ``name`` at, else 2,000 devices spread evenly at
    eps0 = 1 (200 rounds; 50 for multi-message protocols, whose devices send many messages)."""
    if name in ESTIMATOR_CASES:
        return ESTIMATOR_CASES[name]
    instance = default_instance(name, 1.0)
    d, multi = instance.domain_size, instance.build().messages_per_device != 1
    return EstimatorCase(instance, [2000 // d + (v < 2000 % d) for v in range(d)], 50 if multi else 200)


ESTIMATOR_CASES = {
    "binary_rr": EstimatorCase(Instance("binary_rr", 1.0, 2), [1400, 600], 250, batched=False),
    "grr": EstimatorCase(Instance("grr", 2.0, 8), [1000, 400, 200, 160, 120, 80, 40, 0], 250, batched=False),
    "sue": EstimatorCase(Instance("sue", 2.0, 8), SKEWED_8, 300),
    "oue": EstimatorCase(Instance("oue", 2.0, 8), SKEWED_8, 300),
    "subset_selection": EstimatorCase(Instance("subset_selection", 1.0, 8), SKEWED_8, 300),
    "olh": EstimatorCase(Instance("olh", 2.0, 10, {"g": 8}), SKEWED_10, 400),
    "hadamard_response": EstimatorCase(Instance("hadamard_response", 2.0, 10), SKEWED_10, 400),
}


@pytest.mark.parametrize("name", REGISTERED)
def test_estimator_is_unbiased_with_its_stated_variance_and_coverage(name: str) -> None:
    """A population through the real sampler, ``split_messages`` and ``tally`` (``estimator_case``),
    then ``core.audit.check_estimator``: mean, variance and CI coverage per bucket at joint
    false-failure rate ALPHA."""
    case = estimator_case(name)
    mech = case.instance.build()
    counts = sampled_rounds(mech, case.truth, case.rounds, batched=case.batched)
    result = check_estimator(mech, case.truth, counts, alpha=ALPHA)
    assert result.passed, result.failures
    assert np.all(result.variance > 0)
