"""``deniable bench --compare-libraries``: our randomisers against pure-ldp and multi-freq-ldpy.

GRR, OUE and OLH at n devices (default 1,000,000), d = 1024 buckets, ε = 1: the time to randomise
every device's value and to aggregate the reports into estimates, and the mean squared error of
the estimates against the theoretical variance.

- Ours: ``mechanisms.create(name, ...)`` with its vectorised ``randomise_many`` (CSPRNG, exact
  integer thresholds), ``tally`` and ``estimate``; repeated ``repeats`` times so that the MSE
  ratio is averaged over d × repeats estimates (its relative noise is about sqrt(2 / (d · repeats))).
- The libraries randomise and aggregate one report at a time in Python, so they are measured on
  as many devices as fit in a time budget and their times are extrapolated linearly to n (said
  so in the output). A library that is not installed is reported as such and skipped
  (``pip install -e ".[bench]"``).

The truth is a deterministic Zipf population (no random generator). Theoretical variance of a
pure protocol with support probabilities p, q: n q (1 - q) / (p - q)² + n_v (1 - p - q) / (p - q)
(Wang et al. 2017); ours use their own exact ``variance``.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt

from deniable.sim import benchkit, populations, render

MECHANISMS: Final = ("grr", "oue", "olh")
SPEEDUP_TARGET: Final = 10.0
MSE_TOLERANCE: Final = 0.05
PILOT_DEVICES: Final = 200
IntArray = npt.NDArray[np.int64]


@dataclass
class LibraryConfig:
    """Sizes of the comparison."""

    devices: int = 1_000_000
    domain: int = 1024
    epsilon: float = 1.0
    repeats: int = 10
    library_budget_s: float = 20.0
    """Seconds each library may spend per mechanism; beyond it, times are extrapolated."""
    max_library_devices: int = 200_000

    @classmethod
    def quick(cls) -> LibraryConfig:
        """Seconds, for tests and smoke runs."""
        return cls(devices=20_000, repeats=1, library_budget_s=1.0, max_library_devices=2000)


@dataclass
class Row:
    """One implementation of one mechanism."""

    mechanism: str
    implementation: str
    devices_measured: int
    randomise_s: float
    aggregate_s: float
    extrapolated: bool
    mse: float
    theory_variance: float
    mse_ratio: float
    note: str = ""
    total_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.total_s = self.randomise_s + self.aggregate_s


def pure_variance(p: float, q: float, truth: IntArray) -> float:
    """Mean over buckets of the variance of the unbiased count estimate (support probabilities p, q)."""
    n = float(truth.sum())
    per_bucket = n * q * (1 - q) / (p - q) ** 2 + truth * (1 - p - q) / (p - q)
    return float(np.mean(per_bucket))


def _truth(values: IntArray, domain: int) -> IntArray:
    return np.bincount(values, minlength=domain).astype(np.int64)


# --- ours -------------------------------------------------------------------------------------------


def run_ours(name: str, values: IntArray, config: LibraryConfig) -> Row:
    """Our mechanism ``name`` on every value, ``repeats`` times."""
    from deniable.core import mechanisms

    randomiser = mechanisms.create(name, epsilon0=config.epsilon, domain_size=config.domain)
    truth = _truth(values, config.domain)
    n = int(values.size)
    randomise = aggregate = 0.0
    errors = []
    for _ in range(max(1, config.repeats)):
        started = time.perf_counter()
        payloads = randomiser.randomise_many(cast("Sequence[int]", values))
        middle = time.perf_counter()
        tally = randomiser.tally(payloads)
        estimates = np.array([e.estimate for e in randomiser.estimate(tally.counts.tolist(), n)])
        ended = time.perf_counter()
        del payloads
        randomise += middle - started
        aggregate += ended - middle
        errors.append(float(np.mean((estimates - truth) ** 2)))
    repeats = max(1, config.repeats)
    theory = float(np.mean(randomiser.variance(truth.astype(np.float64), n)))
    mse = float(np.mean(errors))
    params = ", ".join(f"{k}={v:g}" for k, v in randomiser.parameters().items())
    return Row(
        name,
        "deniable",
        n,
        randomise / repeats,
        aggregate / repeats,
        False,
        mse,
        theory,
        mse / theory,
        f"CSPRNG, exact thresholds; mean of {repeats} runs" + (f"; {params}" if params else ""),
    )


# --- the libraries ----------------------------------------------------------------------------------

Runner = Callable[[IntArray, int, float], tuple[float, float, Any]]
"""(values, d, eps) -> (randomise seconds, aggregate seconds, estimated counts as an array)."""


_PURE_LDP: Final = {
    "grr": ("direct_encoding", "DEClient", "DEServer", {}),
    "oue": ("unary_encoding", "UEClient", "UEServer", {"use_oue": True}),
    "olh": ("local_hashing", "LHClient", "LHServer", {"use_olh": True}),
}


def _pure_ldp(mechanism: str) -> tuple[Runner, Callable[[float, int], tuple[float, float]]]:
    package, client_name, server_name, options = _PURE_LDP[mechanism]
    module = importlib.import_module(f"pure_ldp.frequency_oracles.{package}")
    probabilities = {"grr": _grr_pq, "oue": _oue_pq, "olh": _olh_pq}[mechanism]

    def run(values: IntArray, d: int, eps: float) -> tuple[float, float, Any]:
        client = getattr(module, client_name)(eps, d, index_mapper=_identity, **options)
        server = getattr(module, server_name)(eps, d, index_mapper=_identity, **options)
        items = values.tolist()
        started = time.perf_counter()
        reports = [client.privatise(v) for v in items]
        middle = time.perf_counter()
        for report in reports:
            server.aggregate(report)
        estimates = server.estimate_all(range(d), suppress_warnings=True)
        return middle - started, time.perf_counter() - middle, np.asarray(estimates, dtype=np.float64)

    return run, probabilities


def _multi_freq(mechanism: str) -> tuple[Runner, Callable[[float, int], tuple[float, float]]]:
    if mechanism == "grr":
        module = importlib.import_module("multi_freq_ldpy.pure_frequency_oracles.GRR")
        client, aggregator, probabilities = module.GRR_Client, module.GRR_Aggregator_MI, _grr_pq
    elif mechanism == "oue":
        module = importlib.import_module("multi_freq_ldpy.pure_frequency_oracles.UE")
        client, probabilities = module.UE_Client, _oue_pq

        def aggregator(reports: Any, d: int, eps: float) -> Any:
            return module.UE_Aggregator_MI(reports, eps, True)

    else:
        module = importlib.import_module("multi_freq_ldpy.pure_frequency_oracles.LH")
        client, aggregator, probabilities = module.LH_Client, module.LH_Aggregator_MI, _olh_pq

    client(0, 4, 1.0)  # numba compiles on the first call: keep that out of the timings

    def run(values: IntArray, d: int, eps: float) -> tuple[float, float, Any]:
        items = values.tolist()
        started = time.perf_counter()
        reports = [client(v, d, eps) for v in items]
        middle = time.perf_counter()
        frequencies = aggregator(reports, d, eps)
        # The library returns clipped, renormalised frequencies: counts are those times n.
        return middle - started, time.perf_counter() - middle, np.asarray(frequencies) * len(items)

    return run, probabilities


def _identity(x: int) -> int:
    return x


def _grr_pq(eps: float, d: int) -> tuple[float, float]:
    return math.exp(eps) / (math.exp(eps) + d - 1), 1 / (math.exp(eps) + d - 1)


def _oue_pq(eps: float, d: int) -> tuple[float, float]:
    return 0.5, 1 / (math.exp(eps) + 1)


def _olh_pq(eps: float, d: int) -> tuple[float, float]:
    g = round(math.exp(eps)) + 1
    return math.exp(eps) / (math.exp(eps) + g - 1), 1 / g


LIBRARIES: Final = {
    "pure-ldp": ("pure_ldp", _pure_ldp, ""),
    "multi-freq-ldpy": ("multi_freq_ldpy", _multi_freq, "estimates clipped and renormalised by the library"),
}


def run_library(library: str, mechanism: str, values: IntArray, config: LibraryConfig) -> Row:
    """One library on as many devices as fit the budget (times extrapolated to all of them)."""
    _, factory, caveat = LIBRARIES[library]
    run, probabilities = factory(mechanism)
    d, eps = config.domain, config.epsilon
    pilot = values[: min(PILOT_DEVICES, values.size)]
    randomise, aggregate, _ = run(pilot, d, eps)
    per_device = max((randomise + aggregate) / max(1, pilot.size), 1e-9)
    measured = int(
        min(values.size, config.max_library_devices, max(pilot.size, config.library_budget_s / per_device))
    )
    sample = values[:measured]
    randomise, aggregate, estimates = run(sample, d, eps)
    scale = values.size / measured
    truth = _truth(sample, d)
    p, q = probabilities(eps, d)
    theory = pure_variance(p, q, truth)
    mse = float(np.mean((estimates - truth) ** 2))
    note = f"measured on {measured:,} devices, times x{scale:.1f}" if measured < values.size else ""
    note = "; ".join(x for x in (note, caveat) if x)
    return Row(
        mechanism,
        library,
        measured,
        randomise * scale,
        aggregate * scale,
        measured < values.size,
        mse,
        theory,
        mse / theory,
        note,
    )


def installed(library: str) -> str | None:
    """None if importable, else why not."""
    module = LIBRARIES[library][0]
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken dependency of theirs
        return f"{type(exc).__name__}: {exc}"
    return None


def compare(config: LibraryConfig, progress: bool = True) -> dict[str, Any]:
    """Every mechanism, ours and each installed library; the report as a dict."""
    values = populations.interleaved_population(populations.zipf_shares(config.domain), config.devices)
    missing = {lib: why for lib in LIBRARIES if (why := installed(lib)) is not None}
    rows: list[Row] = []
    failures: dict[str, str] = {}
    for mechanism in MECHANISMS:
        try:
            rows.append(run_ours(mechanism, values, config))
        except ValueError as exc:  # not registered in this build
            failures[f"deniable/{mechanism}"] = str(exc)
        if progress and rows and rows[-1].mechanism == mechanism:
            print(f"  {mechanism}: deniable done", flush=True)
        for library in LIBRARIES:
            if library in missing:
                continue
            try:
                rows.append(run_library(library, mechanism, values, config))
            except Exception as exc:  # a library's own failure is a finding, not a crash
                failures[f"{library}/{mechanism}"] = f"{type(exc).__name__}: {exc}"
            if progress:
                print(f"  {mechanism}: {library} done", flush=True)
    summary: dict[str, Any] = {}
    for mechanism in MECHANISMS:
        ours = next((r for r in rows if r.mechanism == mechanism and r.implementation == "deniable"), None)
        others = [r for r in rows if r.mechanism == mechanism and r.implementation != "deniable"]
        if ours is None:
            continue
        entry: dict[str, Any] = {
            "mse_ratio": ours.mse_ratio,
            "mse_within_tolerance": abs(ours.mse_ratio - 1) <= MSE_TOLERANCE,
        }
        if others:
            fastest = min(others, key=lambda r: r.total_s)
            entry.update(
                fastest_library=fastest.implementation,
                speedup_vs_fastest_library=fastest.total_s / ours.total_s if ours.total_s else math.inf,
            )
            entry["speedup_met"] = entry["speedup_vs_fastest_library"] >= SPEEDUP_TARGET
        summary[mechanism] = entry
    return {
        "machine": benchkit.machine(),
        "config": asdict(config),
        "rows": [asdict(r) for r in rows],
        "summary": summary,
        "not_installed": missing,
        "failures": failures,
        "targets": {"speedup": SPEEDUP_TARGET, "mse_tolerance": MSE_TOLERANCE},
    }


def format_comparison(report: dict[str, Any]) -> str:
    """The table printed by ``deniable bench --compare-libraries``."""
    config = report["config"]
    lines = [
        f"n = {config['devices']:,} devices, d = {config['domain']}, ε = {config['epsilon']:g}"
        f" ({report['machine']['cpu']}, {report['machine']['cores']} cores)",
        "",
        f"{'mechanism':9} {'implementation':16} {'randomise s':>12} {'aggregate s':>12} {'total s':>9}"
        f" {'MSE/theory':>10}  notes",
    ]
    for row in report["rows"]:
        lines.append(
            f"{row['mechanism']:9} {row['implementation']:16} {row['randomise_s']:>12.2f}"
            f" {row['aggregate_s']:>12.2f} {row['total_s']:>9.2f} {row['mse_ratio']:>10.3g}  {row['note']}"
        )
    lines.append("")
    for mechanism, entry in report["summary"].items():
        text = f"{mechanism}: MSE / theory = {entry['mse_ratio']:.3f}"
        text += f" ({'within' if entry['mse_within_tolerance'] else 'NOT within'} ±{MSE_TOLERANCE:.0%})"
        if "speedup_vs_fastest_library" in entry:
            verdict = "met" if entry["speedup_met"] else "NOT met"
            text += (
                f"; {entry['speedup_vs_fastest_library']:.1f}x faster than {entry['fastest_library']}"
                f" (target ≥ {SPEEDUP_TARGET:g}x: {verdict})"
            )
        lines.append(text)
    for library, why in report["not_installed"].items():
        lines.append(f"{library}: not installed, skipped ({why}); pip install -e '.[bench]'")
    for what, why in report["failures"].items():
        lines.append(f"{what}: failed: {why}")
    return "\n".join(lines)


def run_comparison(
    config: LibraryConfig, json_path: Path | None = None, progress: bool = True
) -> dict[str, Any]:
    """Run, print the table, write JSON if asked."""
    report = compare(config, progress)
    print(format_comparison(report))
    render.write_json(report, json_path)
    return report
