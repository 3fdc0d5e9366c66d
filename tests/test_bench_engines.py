"""The engines behind the ``bench/`` scripts (``deniable.sim.bench_*``) run at tiny sizes and
report the keys the scripts write and the docs name.

No timing is asserted: the figures only have to exist and be positive.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from deniable.core.plumbing.mqtt import BrokerAddress
from deniable.sim.bench_accounting import (
    AccountingConfig,
    ShuffleOnlyConfig,
    run_accounting,
    run_shuffle_only_table,
)
from deniable.sim.bench_footprint import measure
from deniable.sim.bench_release import ReleaseMemoryConfig, run_release_memory
from deniable.sim.bench_storage import SpoolConfig, StoreIngestConfig, run_spool, run_store_ingest
from deniable.sim.bench_transport import MqttSendConfig, TlsOverheadConfig, run_mqtt_send, run_tls_overhead

SPOOL_KEYS = {"append_us", "form_us", "load_delete_us", "total_us"}


def test_store_ingest_times_both_stores_at_each_in_flight(postgres_server: Any) -> None:
    config = StoreIngestConfig(reports=300, batch=100, in_flight=[1, 2], repeat=1)
    report = run_store_ingest(config, postgres_server.dsn())
    assert {report["reports"], report["batch"]} == {300, 100}
    assert report["load_average_at_start"] >= 0
    assert {(r["store"], r["in_flight"]) for r in report["results"]} == {
        (store, k) for store in ("sqlite", "postgres") for k in (1, 2)
    }
    for row in report["results"]:
        assert row["seconds"] > 0 and row["reports_per_s"] > 0 and row["ms_per_batch"] > 0


def test_spool_costs_both_spools_per_report(postgres_server: Any) -> None:
    report = run_spool(SpoolConfig(reports=200, request=50, batch=100), postgres_server.dsn())
    assert (report["reports"], report["request"], report["batch"]) == (200, 50, 100)
    for spool in ("sqlite_segments", "postgresql"):
        assert set(report[spool]) == SPOOL_KEYS
        assert all(v > 0 for v in report[spool].values())


def test_accounting_rows_compare_the_accountant_with_exact_values() -> None:
    config = AccountingConfig(
        ns=[1000], eps0s=[1.0], deltas=[1e-6], grr_ks=[8], grr_ns=[1000], grr_eps0s=[1.0]
    )
    report = run_accounting(config)
    (rr,) = report["binary_rr"]
    assert (rr["n"], rr["epsilon0"], rr["delta"]) == (1000, 1.0, 1e-6)
    assert rr["exact_lower"] > 0 and rr["ratio"] >= 1 - 1e-9
    (grr,) = report["grr"]
    assert grr["k"] == 8 and grr["accountant"] > 0 and grr["full_blanket"] > 0
    assert grr["old_evaluated_n"] <= grr["n"]


def test_accounting_quick_is_the_documented_grid() -> None:
    quick = AccountingConfig.quick()
    assert (quick.ns, quick.eps0s, quick.grr_ns) == ([10**4, 10**5], [1.0, 4.0], [10**5, 10**6])


def test_shuffle_only_tables_have_a_row_per_protocol() -> None:
    tables = run_shuffle_only_table(
        ShuffleOnlyConfig(epsilon=2.0, delta=1e-3, sizes=(1000,), error_n=1000, domains=(2,))
    )
    assert len(tables["epsilon_rows"]) == 2 + 7  # header + one n: seven protocol rows
    assert len(tables["error_rows"]) == 2 + 6  # header + d = 2: six protocols
    assert all(row.startswith("| ") and row.endswith("|") for row in tables["epsilon_rows"])


def test_mqtt_send_times_both_transports(mqtt_broker: BrokerAddress) -> None:
    report = run_mqtt_send(MqttSendConfig(devices=40, repeat=1), mqtt_broker)
    assert report["devices"] == 40
    assert [r["transport"] for r in report["runs"]] == ["grpc", "mqtt"]
    for run in report["runs"]:
        assert sum(run["counted"]) > 0 and run["reports_per_s"] > 0


def test_tls_overhead_times_both_modes() -> None:
    report = run_tls_overhead(TlsOverheadConfig(small=3, large=1, repeat=1))
    assert [m["tls"] for m in report["modes"]] == [False, True]
    assert all(m["us_per_call"] > 0 and m["us_per_report"] > 0 for m in report["modes"])


def test_release_memory_forms_the_whole_release() -> None:
    report = run_release_memory(ReleaseMemoryConfig(messages=650, per_request=65, width=16))
    assert report["messages"] == 650 and report["chunks"] == 1
    assert report["peak_mib_formed"] >= report["peak_mib_filled"] > 0


@pytest.mark.timeout(60)
def test_footprint_measures_an_installation() -> None:
    """The measuring half, on this interpreter (building and installing a wheel takes minutes)."""
    report = measure(Path(sys.executable), "", repeat=1)
    assert report["site_packages_mb"] > 0 and report["import_s_median"] > 0
    assert report["modules"] > 0 and "deniable" in report["distributions"]
    largest = report["largest_mb"]
    assert 0 < len(largest) <= 8 and not any(top.startswith(("pip", "setuptools")) for top in largest)
    assert sum(largest.values()) <= report["site_packages_mb"] + 0.1
