"""Simulation: drive simulated devices through the real services (demo, benchmarks, load test).

Usable from Python without the CLI, e.g. from a notebook; ``deniable demo|bench|loadtest`` are thin
shells over the functions here (docs/simulation.md). Names load on first use, so importing one
submodule (``deniable.sim.render``) does not start the heavy ones.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deniable.sim.bench import BenchConfig, run_bench
    from deniable.sim.bench_libraries import LibraryConfig, run_comparison
    from deniable.sim.bench_memory import MemoryConfig, run_memory
    from deniable.sim.bench_protocols import ProtocolConfig, run_protocols
    from deniable.sim.demo import run_demo, run_pipeline
    from deniable.sim.loadtest import LoadConfig, run_loadtest
    from deniable.sim.local import LocalServices, Reported, local_services, simulate

_HOMES = {
    "BenchConfig": "bench",
    "run_bench": "bench",
    "LibraryConfig": "bench_libraries",
    "run_comparison": "bench_libraries",
    "MemoryConfig": "bench_memory",
    "run_memory": "bench_memory",
    "ProtocolConfig": "bench_protocols",
    "run_protocols": "bench_protocols",
    "run_demo": "demo",
    "run_pipeline": "demo",
    "LoadConfig": "loadtest",
    "run_loadtest": "loadtest",
    "LocalServices": "local",
    "Reported": "local",
    "local_services": "local",
    "simulate": "local",
}

__all__ = [
    "BenchConfig",
    "LibraryConfig",
    "LoadConfig",
    "LocalServices",
    "MemoryConfig",
    "ProtocolConfig",
    "Reported",
    "local_services",
    "run_bench",
    "run_comparison",
    "run_demo",
    "run_loadtest",
    "run_memory",
    "run_pipeline",
    "run_protocols",
    "simulate",
]


def __getattr__(name: str) -> Any:
    """Import a front door's module the first time it is asked for (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'deniable.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(f"deniable.sim.{home}"), name)
