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
import math
from collections import Counter
from collections.abc import Callable
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


@dataclass(frozen=True, eq=False)
class Instance:
    """One registered mechanism at one parameter point."""

    name: str
    epsilon0: float
    domain_size: int
    params: dict[str, Any] = field(default_factory=dict)
    samples: int = 20_000  # reports per value for the statistical checks

    def build(self) -> LocalRandomiser:
        """The randomiser, through the registry as the services build it."""
        return mechanisms.create(
            self.name, epsilon0=self.epsilon0, domain_size=self.domain_size, **self.params
        )

    @property
    def id(self) -> str:
        """Readable test id: name, epsilon and domain size."""
        extra = "".join(f"-{k}{v}" for k, v in self.params.items() if k != "expected_n")
        return f"{self.name}-eps{self.epsilon0}-d{self.domain_size}{extra}-n{self.samples}"


def default_instance(name: str, epsilon0: float) -> Instance:
    """A small instance of ``name``: its default domain size (else 4), ``expected_n`` if it takes one."""
    signature = inspect.signature(mechanisms.mechanism_class(name))
    domain = signature.parameters["domain_size"].default
    params = {"expected_n": EXPECTED_N} if "expected_n" in signature.parameters else {}
    return Instance(name, epsilon0, 4 if domain is inspect.Parameter.empty else int(domain), params)


REGISTERED = mechanisms.names()
DEFAULT_INSTANCES = [default_instance(name, eps) for name in REGISTERED for eps in (0.5, 1.0, 4.0)]
EPSILONS = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0)

# Parameter points the per-mechanism files used to check the same properties at, kept so that no
# checked point is lost. Exact and domain checks run at every instance ...
INSTANCES = [
    *DEFAULT_INSTANCES,
    *[Instance("binary_rr", eps, 2) for eps in EPSILONS],
    *[Instance("grr", eps, k) for eps in EPSILONS for k in (2, 3, 8, 100)],
    Instance("grr", 1.0, 300),
    *[Instance(n, eps, d) for n in ("sue", "oue") for eps in (0.5, 1.0, 2.0, 4.0) for d in (2, 3, 5, 9)],
    *[Instance(n, 1.0, 11) for n in ("sue", "oue")],
    *[Instance("hadamard_response", eps, d) for eps in (0.5, 2.0) for d in (3, 7, 12, 31)],
    *[Instance("hadamard_response", 1.0, d) for d in (10, 100)],
    *[Instance("olh", eps, d, {"g": g}) for eps in (0.5, 2.0) for g, d in ((2, 9), (4, 17), (9, 12))],
    *[Instance("olh", 1.0, d, {"g": g}) for g, d in ((3, 10), (5, 100))],
    *[Instance("subset_selection", eps, d, {"subset_size": w}) for eps, d, w in ((1.0, 9, 4), (4.0, 5, 2))],
    Instance("subset_selection", 1.0, 11, {"subset_size": 4}),
]
# ... statistical checks at the registry's defaults and at these points, with the sample size
# (reports per value through randomise_many; randomise gets at most 30,000) they were checked at.
STATISTICAL_INSTANCES = [
    *DEFAULT_INSTANCES,
    *[Instance("binary_rr", eps, 2, samples=100_000) for eps in (0.5, 1.0, 4.0)],
    Instance("binary_rr", 8.0, 2, samples=200_000),
    *[Instance("grr", eps, k, samples=100_000) for eps, k in ((1.0, 3), (2.0, 8), (4.0, 100))],
    *[Instance("hadamard_response", eps, d, samples=30_000) for eps, d in ((1.0, 5), (4.0, 12))],
    *[Instance("hadamard_response", eps, d, samples=200_000) for eps, d in ((0.5, 3), (2.0, 31))],
    Instance("hadamard_response", 4.0, 100, samples=400_000),
    *[Instance("hadamard_response", eps, d, samples=100_000) for eps, d in ((1.0, 7), (2.0, 12), (4.0, 5))],
    *[Instance("olh", eps, d, {"g": g}, samples=20_000) for eps, g, d in ((1.0, 3, 10), (0.5, 8, 10))],
    *[
        Instance("olh", eps, d, {"g": g}, samples=200_000)
        for eps, g, d in ((2.0, 4, 17), (0.5, 9, 12), (4.0, 5, 7))
    ],
    *[
        Instance("olh", eps, d, {"g": g}, samples=100_000)
        for eps, g, d in ((0.5, 3, 10), (1.0, 4, 17), (2.0, 8, 10))
    ],
    *[
        Instance(n, eps, d, samples=300_000)
        for n in ("sue", "oue")
        for eps, d in ((1.0, 5), (4.0, 3), (2.0, 9))
    ],
    *[
        Instance("subset_selection", eps, d, {"subset_size": w}, samples=20_000)
        for eps, d, w in ((1.0, 5, 2), (0.5, 6, 3))
    ],
]


def instances(
    predicate: Callable[[Instance], bool] | None = None, *, statistical: bool = False
) -> pytest.MarkDecorator:
    """``INSTANCES`` (or ``STATISTICAL_INSTANCES``) that ``predicate`` holds for, as pytest parameters."""
    pool = STATISTICAL_INSTANCES if statistical else INSTANCES
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


@instances()
def test_randomise_draws_from_the_given_csprng_only(instance: Instance) -> None:
    """Two equally keyed CSPRNGs give the same payloads: no other source of randomness is read."""
    mech = instance.build()
    values = [v % mech.domain_size for v in range(40)]
    for _ in range(2):
        first, second = CountingRng(), CountingRng()
        assert [mech.randomise(v, first) for v in values] == [mech.randomise(v, second) for v in values]
        assert mech.randomise_many(values, first) == mech.randomise_many(values, second)
        assert first.drawn > 0


@instances()
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


@instances()
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


@instances(single_message)
def test_tally_counts_its_own_payloads_and_flags_malformed_ones(instance: Instance) -> None:
    mech = instance.build()
    support = sorted({payload for law in laws(mech) for payload in law})
    width = mech.payload_length
    malformed = [b"", bytes(width + 1), b"\xff" * (width + 3)]
    if width <= 2:  # every byte string of the right length outside the support
        malformed += [x for i in range(256**width) if (x := i.to_bytes(width, "big")) not in set(support)][
            :64
        ]
    tally = mech.tally([*support, *malformed])
    assert tally.invalid.tolist() == [False] * len(support) + [True] * len(malformed)
    assert tally.valid_count == len(support)
    assert mech.tally(malformed).counts.tolist() == [0] * mech.count_cells
    assert not mech.tally(mech.randomise_many([v % mech.domain_size for v in range(50)])).invalid.any()


# =========================================================================== statistics


@instances(single_message, statistical=True)
def test_randomise_and_randomise_many_sample_the_exact_law(instance: Instance) -> None:
    """Scalar and vectorised paths each fit ``output_distribution`` (``core.audit.chi_square_fit``)
    for inputs 0, d // 2 and d - 1; false-failure rate ALPHA per fit, so at most 6e-6 per test."""
    mech = instance.build()
    d = mech.domain_size
    for value in sorted({0, d // 2, d - 1}):
        law = mech.output_distribution(value)
        n = instance.samples  # chi_square_fit pools the outputs expected fewer than 5 times
        scalar = Counter(mech.randomise(value) for _ in range(min(n, 30_000)))
        assert not chi_square_fit(scalar, law, ALPHA).rejects, "randomise"
        assert not chi_square_fit(Counter(mech.randomise_many([value] * n)), law, ALPHA).rejects, (
            "randomise_many"
        )


@instances(local, statistical=True)
def test_audit_lower_bound_does_not_exceed_epsilon0(instance: Instance) -> None:
    """``core.audit.audit`` of inputs 0 and d - 1 with ``samples`` reports each: refutes an honest
    claim with probability at most ALPHA (the audit's own level)."""
    mech = instance.build()
    result = audit(mech, 0, mech.domain_size - 1, instance.samples, alpha=ALPHA)
    assert result.epsilon_lower_bound <= instance.epsilon0, result
    assert not result.refutes_claim


ESTIMATOR_EPSILON = 1.0


@pytest.mark.parametrize("name", REGISTERED)
def test_estimator_is_unbiased_with_its_stated_variance_and_coverage(name: str) -> None:
    """Population of 2,000 through the real ``randomise_many`` and ``tally``, 200 rounds (50 for
    multi-message protocols),
    ``core.audit.check_estimator``: mean, variance and CI coverage per bucket at joint
    false-failure rate ALPHA."""
    mech = default_instance(name, ESTIMATOR_EPSILON).build()
    d = mech.domain_size
    truth = [2000 // d + (1 if v < 2000 % d else 0) for v in range(d)]
    rounds = 200 if mech.messages_per_device == 1 else 50  # many messages per device cost more
    result = check_estimator(mech, truth, sampled_rounds(mech, truth, rounds), alpha=ALPHA)
    assert result.passed, result.failures
    assert np.all(result.variance > 0)
