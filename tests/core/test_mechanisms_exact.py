"""Exact (rational) properties of the registered randomisers: no sampling, no tolerance games.

Every probability is a ``Fraction``; e**x is compared through ``decimal`` at 60 significant
digits, whose ``exp`` is correctly rounded, so "<" and ">=" below are proofs, not estimates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest
from support.stats import exp_interval, law_worst_ratio

from deniable.core import mechanisms
from deniable.core.mechanisms import LocalRandomiser
from deniable.core.mechanisms.direct import DirectEncoding
from deniable.core.mechanisms.exact import PROBABILITY_BITS, exp_lower_bound, z_score
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

EPSILONS = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0)
GRR_SIZES = (2, 3, 8, 100)
CONFIGS = [("binary_rr", eps, 2) for eps in EPSILONS] + [
    ("grr", eps, k) for eps in EPSILONS for k in GRR_SIZES
]
CONFIG_IDS = [f"{name}-eps{eps}-k{k}" for name, eps, k in CONFIGS]


def build(name: str, eps: float, k: int) -> LocalRandomiser:
    return mechanisms.create(name, epsilon0=eps, domain_size=k)


def distributions(mech: LocalRandomiser) -> list[dict[bytes, Fraction]]:
    return [mech.output_distribution(v) for v in range(mech.domain_size)]


def worst_ratio(mech: LocalRandomiser) -> Fraction:
    """max over outputs o and inputs v, w of P(o | v) / P(o | w), exactly."""
    return law_worst_ratio(distributions(mech))


# --------------------------------------------------------------------------- exp_lower_bound


@pytest.mark.parametrize(
    "x", [0.0, 5e-324, 1e-300, 2**-40, 1e-10, 0.1, 0.5, 1.0, math.log(2), 2.0, 4.0, 8.0, 20.0, 50.0, 100.0]
)
def test_exp_lower_bound_is_a_strict_and_close_lower_bound(x: float) -> None:
    bound = exp_lower_bound(x)
    lo, hi = exp_interval(x)
    assert isinstance(bound, Fraction)
    if x == 0:
        assert bound == 1
        return
    assert bound < lo, "must be strictly below e**x"
    assert (hi - bound) / lo <= Fraction(1, 2**64), "documented: within 2**-64 relative"
    assert bound.denominator <= 2**PROBABILITY_BITS


def test_exp_lower_bound_is_monotone_on_a_grid() -> None:
    grid = [i / 64 for i in range(0, 64 * 9)]
    bounds = [exp_lower_bound(x) for x in grid]
    assert all(a < b for a, b in itertools.pairwise(bounds))


@pytest.mark.parametrize("x", [-1e-300, -1.0, math.nan, math.inf, -math.inf])
def test_exp_lower_bound_rejects_bad_exponents(x: float) -> None:
    with pytest.raises(ValueError):
        exp_lower_bound(x)


# --------------------------------------------------------------------------- exact laws


@pytest.mark.parametrize(("name", "eps", "k"), CONFIGS, ids=CONFIG_IDS)
def test_direct_encoding_law_has_the_textbook_shape(name: str, eps: float, k: int) -> None:
    """P(report v | v) = p, P(report w | v) = q for w != v, p / q = the worst ratio, and the
    textbook p = e^eps / (e^eps + k - 1) within 2**-30 relative."""
    mech = build(name, eps, k)
    assert isinstance(mech, DirectEncoding)
    p, q = mech.keep_probability, mech.other_probability
    assert p + (k - 1) * q == 1
    for v, law in enumerate(distributions(mech)):
        for w in range(k):
            assert law[w.to_bytes(mech.payload_length, "big")] == (p if w == v else q)
    assert p / q == worst_ratio(mech)
    textbook = math.exp(eps) / (math.exp(eps) + k - 1)
    assert abs(float(p) - textbook) <= textbook * 2**-30


# --------------------------------------------------------------------------- randomise


def test_payload_length_grows_with_the_domain() -> None:
    assert build("binary_rr", 1.0, 2).payload_length == 1
    assert build("grr", 1.0, 256).payload_length == 1
    assert build("grr", 1.0, 257).payload_length == 2
    assert build("grr", 1.0, 65_537).payload_length == 3


class ScriptedRng(Csprng):
    """Returns scripted draws and records what was asked, to check the draw → output map."""

    def __init__(self) -> None:
        super().__init__(key=bytes(32))
        self.next_draw = 0
        self.calls: list[tuple[str, int]] = []

    def randbits(self, bits: int) -> int:
        self.calls.append(("randbits", bits))
        assert 0 <= self.next_draw < 1 << bits
        return self.next_draw

    def randbelow(self, upper: int) -> int:
        self.calls.append(("randbelow", upper))
        assert 0 <= self.next_draw < upper
        return self.next_draw


def _draw_space(mech: LocalRandomiser) -> int:
    rng = ScriptedRng()
    mech.randomise(0, rng)
    assert len(rng.calls) == 1, "exactly one draw per report"
    kind, arg = rng.calls[0]
    return 1 << arg if kind == "randbits" else arg


def _outputs(mech: LocalRandomiser, value: int, draws: Iterator[int] | list[int]) -> list[int]:
    rng = ScriptedRng()
    result = []
    for draw in draws:
        rng.next_draw = draw
        result.append(int.from_bytes(mech.randomise(value, rng), "big"))
    return result


@pytest.mark.parametrize(("name", "eps", "k"), [("binary_rr", 1.0, 2), ("binary_rr", 8.0, 2)])
def test_binary_draw_map_gives_exactly_keep_probability(name: str, eps: float, k: int) -> None:
    """The flip is one threshold comparison on a uniform 64-bit draw: exactly T draws keep, so
    P(keep) = T / 2**64 = keep_probability with no rounding."""
    mech = build(name, eps, k)
    assert isinstance(mech, DirectEncoding)
    space = _draw_space(mech)
    assert space == 2**PROBABILITY_BITS
    threshold = mech.keep_probability * space
    assert threshold.denominator == 1
    t = int(threshold)
    for v in (0, 1):
        assert _outputs(mech, v, [0, 1, t // 2, t - 1]) == [v] * 4
        assert _outputs(mech, v, [t, t + 1, space - 1]) == [1 - v] * 3


@pytest.mark.parametrize(("eps", "k"), [(1.0, 2), (0.5, 3), (2.0, 8), (4.0, 100)])
def test_grr_draw_map_gives_exactly_the_output_distribution(eps: float, k: int) -> None:
    """draw < keep weight → the true value; the rest splits into k - 1 slots of equal width, slot
    i → the i-th other value in increasing order. The map is monotone on each side, so checking
    both ends of every slot proves each output gets exactly its probability's share of draws."""
    mech = build("grr", eps, k)
    assert isinstance(mech, DirectEncoding)
    space = _draw_space(mech)
    keep = mech.keep_probability * space
    width = mech.other_probability * space
    assert keep.denominator == 1 and width.denominator == 1
    keep_w, width_w = int(keep), int(width)
    assert keep_w + (k - 1) * width_w == space
    for v in sorted({0, 1, k // 2, k - 1}):
        assert _outputs(mech, v, [0, keep_w // 3, keep_w - 1]) == [v] * 3
        others = [w for w in range(k) if w != v]
        starts = [keep_w + i * width_w for i in range(k - 1)]
        assert _outputs(mech, v, starts) == others
        assert _outputs(mech, v, [s + width_w - 1 for s in starts]) == others
        assert _outputs(mech, v, [s + width_w // 2 for s in starts]) == others


# --------------------------------------------------------------------------- registry


def test_registry_names_and_proto_mapping() -> None:
    assert {"binary_rr", "grr"} <= set(mechanisms.names())
    assert set(mechanisms.summaries()) == set(mechanisms.names())
    wire_values = {value for value in pb.Mechanism.values() if value != pb.MECHANISM_UNSPECIFIED}
    assert {mechanisms.proto_for_name(name) for name in mechanisms.names()} == wire_values
    assert mechanisms.name_for_proto(pb.BINARY_RR) == "binary_rr"
    assert mechanisms.name_for_proto(pb.GRR) == "grr"
    for name in mechanisms.names():
        assert mechanisms.name_for_proto(mechanisms.proto_for_name(name)) == name
    with pytest.raises(ValueError):
        mechanisms.name_for_proto(pb.MECHANISM_UNSPECIFIED)
    with pytest.raises(ValueError):
        mechanisms.name_for_proto(99)
    with pytest.raises(ValueError):
        mechanisms.proto_for_name("laplace")


def test_create_builds_working_randomisers() -> None:
    assert mechanisms.create("binary_rr", epsilon0=1.0, domain_size=2).domain_size == 2
    mech = mechanisms.create("grr", epsilon0=1.5, domain_size=5)
    assert (mech.epsilon0, mech.domain_size, mech.count_cells) == (1.5, 5, 5)


@pytest.mark.parametrize(
    ("name", "eps", "k"),
    [
        ("laplace", 1.0, 2),
        ("", 1.0, 2),
        ("grr", 1.0, 1),
        ("grr", 1.0, 0),
        ("grr", 1.0, -3),
        ("binary_rr", 1.0, 1),
        ("binary_rr", 1.0, 3),
        ("grr", 1.0, 2**24 + 1),
        *[(n, e, 2) for n in ("binary_rr", "grr") for e in (0.0, -0.0, -1.0, math.nan, math.inf, -math.inf)],
    ],
)
def test_create_rejects_bad_parameters(name: str, eps: float, k: int) -> None:
    with pytest.raises(ValueError):
        mechanisms.create(name, epsilon0=eps, domain_size=k)


def test_create_reports_unknown_parameters_as_value_error() -> None:
    """``create`` documents ValueError for bad parameters; an unknown keyword is one."""
    with pytest.raises(ValueError):
        mechanisms.create("grr", epsilon0=1.0, domain_size=3, bucket_bits=4)


# --------------------------------------------------------------------------- estimator, exactly


def _exact_count_variance(mech: LocalRandomiser, truth: list[int]) -> list[Fraction]:
    """Var of each cell's count from the exact law: sum over users of P(o | x)(1 - P(o | x))."""
    laws = distributions(mech)
    out = []
    for cell in range(mech.count_cells):
        key = cell.to_bytes(mech.payload_length, "big")
        out.append(
            sum((x * law[key] * (1 - law[key]) for x, law in zip(truth, laws, strict=True)), Fraction(0))
        )
    return out


@pytest.mark.parametrize(
    ("name", "eps", "truth"),
    [
        ("binary_rr", 1.0, [700, 300]),
        ("binary_rr", 4.0, [0, 1000]),
        ("grr", 2.0, [5000, 2000, 1000, 800, 600, 400, 200, 0]),
        ("grr", 0.5, [1, 2, 3]),
        ("grr", 4.0, [10_000, *[0] * 99]),
    ],
)
def test_variance_formula_matches_the_exact_law(name: str, eps: float, truth: list[int]) -> None:
    """variance(truth, n) = Var(count) / (p - q)**2, Var(count) derived independently from
    output_distribution — this includes the truth-dependent term of GRR."""
    mech = build(name, eps, len(truth))
    assert isinstance(mech, DirectEncoding)
    n = sum(truth)
    gap = mech.keep_probability - mech.other_probability
    expected = [float(v / gap**2) for v in _exact_count_variance(mech, truth)]
    got = mech.variance(truth, n)
    assert got.shape == (len(truth),)
    np.testing.assert_allclose(got, expected, rtol=1e-9)


@pytest.mark.parametrize(
    ("name", "eps", "truth"),
    [("binary_rr", 1.0, [700, 300]), ("grr", 2.0, [5000, 2000, 1000, 800, 600, 400, 200, 0])],
)
def test_estimate_inverts_the_expected_counts_and_builds_the_ci(
    name: str, eps: float, truth: list[int]
) -> None:
    mech = build(name, eps, len(truth))
    assert isinstance(mech, DirectEncoding)
    n = sum(truth)
    p, q = mech.keep_probability, mech.other_probability
    expected_counts = [float(x * p + (n - x) * q) for x in truth]
    rows = mech.estimate(expected_counts, n)  # type: ignore[arg-type]  # linearity check
    np.testing.assert_allclose([r.estimate for r in rows], truth, atol=1e-6 * n)
    variances = mech.variance(np.clip([r.estimate for r in rows], 0, n), n)
    for row, var in zip(rows, variances, strict=True):
        assert row.std_error == pytest.approx(math.sqrt(var), rel=1e-12)
        z = NormalDist().inv_cdf(0.975)
        assert row.ci_low == pytest.approx(row.estimate - z * row.std_error, rel=1e-12, abs=1e-9)
        assert row.ci_high == pytest.approx(row.estimate + z * row.std_error, rel=1e-12, abs=1e-9)
    # p + (k - 1) q = 1 makes the estimates of any count vector sum to n exactly
    lumpy = [3 * c + 1 for c in range(len(truth))]
    assert sum(r.estimate for r in mech.estimate(lumpy, sum(lumpy))) == pytest.approx(sum(lumpy), rel=1e-9)
    narrow = mech.estimate([round(c) for c in expected_counts], n, confidence=0.5)
    wide = mech.estimate([round(c) for c in expected_counts], n, confidence=0.999)
    for a, b in zip(narrow, wide, strict=True):
        assert a.ci_high - a.ci_low < b.ci_high - b.ci_low
    with pytest.raises(ValueError):
        mech.estimate([1] * (len(truth) + 1), n)


def test_z_score() -> None:
    assert z_score(0.95) == pytest.approx(1.959963984540054, rel=1e-12)
    assert z_score(0.5) == pytest.approx(0.6744897501960817, rel=1e-12)
    for bad in (0.0, 1.0, -0.5, 1.5, math.nan):
        with pytest.raises(ValueError):
            z_score(bad)


def test_default_rng_is_used_when_none_given() -> None:
    """randomise(v) without an rng must draw from the process CSPRNG (not a fixed stream)."""
    mech = build("grr", 0.1, 100)
    draws = {mech.randomise(3) for _ in range(200)}
    assert len(draws) > 20  # 200 draws over ~100 near-uniform outputs; P(<= 20 distinct) < 1e-40
    assert default_rng() is default_rng()
