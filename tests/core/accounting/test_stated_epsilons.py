"""Stated central epsilons do not move: every registered mechanism, on a grid of (epsilon0, n,
delta), against values recorded from main before analyses moved onto mechanisms (ADR 0027).
Regenerate only on purpose: ``python tests/core/accounting/test_stated_epsilons.py``.

The values are recorded bit-exact (float.hex), but compared within a relative tolerance of
``REL_TOL`` (1e-12): the same code differs in the last bit or two on other CPUs and libm builds
(an AMD EPYC gave ``0x1.6c9796556ae05p-6`` for the recorded ``...ae04p-6``, OLH at n 50,000).
The tolerance is two-sided and tight: a stated epsilon larger (weaker guarantee) or smaller
(claiming more privacy) than recorded by more than 1e-12 of it fails, as does any change of the
analysis named or of an error raised.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from deniable.core import mechanisms
from deniable.core.accounting import best_bound

FIXTURE = Path(__file__).with_name("stated_epsilons.json")
EPSILON0S = (0.5, 1.0, 3.0)
NS = (1, 1_000, 50_000)
DELTAS = (1e-6, 1e-9)
GENERIC = "(generic)"


EXPECTED_N = 20_000  # shuffle-only protocols are parametrised for this many devices


def _create(name: str, epsilon0: float) -> mechanisms.LocalRandomiser:
    """The mechanism over 8 values, or 2 where it only takes bits."""
    params = {} if mechanisms.mechanism_class(name).local_privacy else {"expected_n": EXPECTED_N}
    try:
        return mechanisms.create(name, epsilon0=epsilon0, domain_size=8, **params)
    except ValueError:
        return mechanisms.create(name, epsilon0=epsilon0, domain_size=2, **params)


def _domain(name: str) -> int:
    return _create(name, 1.0).domain_size


def _key(name: str, epsilon0: float, n: int, delta: float, path: str) -> str:
    return f"{name}|{epsilon0:g}|{n}|{delta:g}|{path}"


def _mechanism_epsilon(name: str, epsilon0: float, n: int, delta: float) -> str:
    """The mechanism's own stated epsilon (float.hex: bit-exact), or the error it raises."""
    try:
        randomiser = _create(name, epsilon0)
        bound = randomiser.central_guarantee(n, delta)
    except (ValueError, ArithmeticError) as exc:
        return f"error: {type(exc).__name__}"
    return f"{bound.epsilon.hex()} {bound.analysis}"


def _accountant_epsilon(name: str, epsilon0: float, n: int, delta: float) -> str:
    """The accountant's tightest bound when asked by name (None: the generic analyses)."""
    mechanism = None if name == GENERIC else name
    domain = None if mechanism is None else _domain(name)
    try:
        bound = best_bound(epsilon0, n, delta, mechanism, domain)
    except (ValueError, ArithmeticError) as exc:
        return f"error: {type(exc).__name__}"
    return f"{bound.epsilon.hex()} {bound.analysis}"


Grid = tuple[tuple[float, ...], tuple[int, ...], tuple[float, ...]]
FULL: Grid = (EPSILON0S, NS, DELTAS)
QUICK: Grid = ((1.0,), (1, 50_000), (1e-6,))
"""The default run's part of the grid; the whole grid runs with ``-m slow``."""


def _values_of(name: str, grid: Grid = FULL) -> dict[str, str]:
    """One mechanism's stated epsilons on the grid (GENERIC: the accountant's generic analyses)."""
    values: dict[str, str] = {}
    local = name == GENERIC or mechanisms.mechanism_class(name).local_privacy
    epsilon0s, ns, deltas = grid
    for epsilon0 in epsilon0s:
        for n in ns:
            for delta in deltas:
                if name != GENERIC:
                    values[_key(name, epsilon0, n, delta, "mechanism")] = _mechanism_epsilon(
                        name, epsilon0, n, delta
                    )
                if local:
                    values[_key(name, epsilon0, n, delta, "accountant")] = _accountant_epsilon(
                        name, epsilon0, n, delta
                    )
    return values


def current_values(names: list[str]) -> dict[str, str]:
    """Every stated epsilon of these mechanisms on the grid, as the code now computes it."""
    return {key: value for name in names for key, value in _values_of(name).items()}


REL_TOL = 1e-12
"""Relative tolerance on a stated epsilon: a few ulps (2.2e-16 each), far below any real change."""


def _same_value(current: str, recorded: str) -> bool:
    """One grid point agrees: same analysis (or same error), epsilon within ``REL_TOL``."""
    if current.startswith("error:") or recorded.startswith("error:"):
        return current == recorded
    current_eps, _, current_analysis = current.partition(" ")
    recorded_eps, _, recorded_analysis = recorded.partition(" ")
    if current_analysis != recorded_analysis:
        return False
    now, then = float.fromhex(current_eps), float.fromhex(recorded_eps)
    return now == then or math.isclose(now, then, rel_tol=REL_TOL, abs_tol=0.0)


def _differences(current: dict[str, str], recorded: dict[str, str]) -> list[str]:
    """Grid points that are missing on one side or do not agree (empty: all agree)."""
    keys = sorted(set(current) | set(recorded))
    return [
        f"{key}: now {current.get(key)!r}, recorded {recorded.get(key)!r}"
        for key in keys
        if key not in current or key not in recorded or not _same_value(current[key], recorded[key])
    ]


def _recorded(name: str, keys: set[str] | None = None) -> dict[str, str]:
    recorded = json.loads(FIXTURE.read_text())
    return {k: v for k, v in recorded.items() if k.split("|")[0] == name and (keys is None or k in keys)}


@pytest.mark.parametrize("name", [GENERIC, *mechanisms.names()])
def test_stated_epsilons_match_the_recorded_ones_at_a_few_points(name: str) -> None:
    current = _values_of(name, QUICK)
    assert current and _differences(current, _recorded(name, set(current))) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", [GENERIC, *mechanisms.names()])
def test_stated_epsilons_match_the_recorded_ones(name: str) -> None:
    assert _differences(_values_of(name), _recorded(name)) == []


def test_the_comparison_accepts_a_last_bit_and_refuses_a_real_change() -> None:
    recorded = {"olh|1|50000|1e-06|mechanism": "0x1.6c9796556ae04p-6 shuffle-olh"}
    key = next(iter(recorded))

    def differences(value: str) -> list[str]:
        return _differences({key: value}, recorded)

    assert differences("0x1.6c9796556ae05p-6 shuffle-olh") == []  # the EPYC's last bit
    assert differences("0x1.6c9796556ae03p-6 shuffle-olh") == []
    eps = float.fromhex("0x1.6c9796556ae04p-6")
    assert differences(f"{(eps * (1 + 1e-11)).hex()} shuffle-olh")  # larger by 1e-11: refused
    assert differences(f"{(eps * (1 - 1e-11)).hex()} shuffle-olh")  # smaller by 1e-11: refused
    assert differences("0x1.6c9796556ae04p-6 generic-fmt")  # another analysis
    assert differences("error: ValueError")
    assert _differences({}, recorded) and _differences(recorded | {"x|1|1|1|m": "error: E"}, recorded)


def test_the_fixture_covers_every_registered_mechanism() -> None:
    recorded = {key.split("|")[0] for key in json.loads(FIXTURE.read_text())}
    assert recorded == {GENERIC, *mechanisms.names()}


if __name__ == "__main__":
    FIXTURE.write_text(
        json.dumps(current_values([GENERIC, *mechanisms.names()]), indent=1, sort_keys=True) + "\n"
    )
    sys.exit(0)
