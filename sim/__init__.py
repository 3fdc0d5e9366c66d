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
    from deniable.sim.bench_accounting import (
        AccountingConfig,
        ShuffleOnlyConfig,
        run_accounting,
        run_shuffle_only_table,
    )
    from deniable.sim.bench_footprint import FootprintConfig, run_footprint
    from deniable.sim.bench_libraries import LibraryConfig, run_comparison
    from deniable.sim.bench_memory import MemoryConfig, run_memory
    from deniable.sim.bench_protocols import ProtocolConfig, run_protocols
    from deniable.sim.bench_release import ReleaseMemoryConfig, run_release_memory
    from deniable.sim.bench_storage import SpoolConfig, StoreIngestConfig, run_spool, run_store_ingest
    from deniable.sim.bench_transport import (
        MqttSendConfig,
        TlsOverheadConfig,
        run_mqtt_send,
        run_tls_overhead,
    )
    from deniable.sim.demo import run_demo, run_pipeline
    from deniable.sim.loadtest import LoadConfig, run_loadtest
    from deniable.sim.local import LocalServices, Reported, local_services, simulate

_HOMES = {
    "BenchConfig": "bench",
    "run_bench": "bench",
    "AccountingConfig": "bench_accounting",
    "ShuffleOnlyConfig": "bench_accounting",
    "run_accounting": "bench_accounting",
    "run_shuffle_only_table": "bench_accounting",
    "FootprintConfig": "bench_footprint",
    "run_footprint": "bench_footprint",
    "ReleaseMemoryConfig": "bench_release",
    "run_release_memory": "bench_release",
    "SpoolConfig": "bench_storage",
    "StoreIngestConfig": "bench_storage",
    "run_spool": "bench_storage",
    "run_store_ingest": "bench_storage",
    "MqttSendConfig": "bench_transport",
    "TlsOverheadConfig": "bench_transport",
    "run_mqtt_send": "bench_transport",
    "run_tls_overhead": "bench_transport",
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
    "AccountingConfig",
    "BenchConfig",
    "FootprintConfig",
    "LibraryConfig",
    "LoadConfig",
    "LocalServices",
    "MemoryConfig",
    "MqttSendConfig",
    "ProtocolConfig",
    "ReleaseMemoryConfig",
    "Reported",
    "ShuffleOnlyConfig",
    "SpoolConfig",
    "StoreIngestConfig",
    "TlsOverheadConfig",
    "local_services",
    "run_accounting",
    "run_bench",
    "run_comparison",
    "run_demo",
    "run_footprint",
    "run_loadtest",
    "run_memory",
    "run_mqtt_send",
    "run_pipeline",
    "run_protocols",
    "run_release_memory",
    "run_shuffle_only_table",
    "run_spool",
    "run_store_ingest",
    "run_tls_overhead",
    "simulate",
]


def __getattr__(name: str) -> Any:
    """Import a front door's module the first time it is asked for (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'deniable.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(f"deniable.sim.{home}"), name)
