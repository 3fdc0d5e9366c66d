"""``deniable bench`` runs end to end on tiny sizes and reports what docs/performance.md documents.

No timing is asserted anywhere: the figures only have to exist and be positive.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.logs import preserved_logger

from deniable.cli.main import main
from deniable.sim import bench_libraries
from deniable.sim.bench_libraries import LibraryConfig, compare, format_comparison


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """``main`` configures the ``deniable`` logger (no propagation): put it back for later tests."""
    with preserved_logger("deniable"):
        yield


DOCUMENTED_KEYS = (
    "decrypt_ceiling_per_s",
    "end_to_end_per_s",
    "ratio_end_to_end_to_ceiling",
    "shuffler_cpu_us_per_report",
    "aggregator_cpu_us_per_report",
    "shuffler_to_aggregator_cpu_ratio",
    "stages",
    "machine",
)
STAGES = (
    "ceiling: HPKE decrypt, all cores",
    "HPKE encrypt, all cores",
    "device: randomise + seal, all cores",
    "shuffler: ingest (SubmitReports, durable spool)",
    "shuffler: permute + forward (Flush)",
    "aggregator: ingest + decrypt + count",
    "end to end: first submit -> last counted",
)


def test_bench_quick_emits_the_documented_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    for key in DOCUMENTED_KEYS:
        assert key in report, key
    assert report["decrypt_ceiling_per_s"] > 0
    assert report["end_to_end_per_s"] > 0
    assert report["ratio_end_to_end_to_ceiling"] > 0
    assert report["aggregator_cpu_us_per_report"] > 0
    assert report["shuffler_cpu_us_per_report"] >= 0  # CPU clock ticks are 10 ms: tiny runs may read 0
    stages = {stage["name"]: stage for stage in report["stages"]}
    for name in STAGES:
        assert stages[name]["per_s"] > 0, name
        assert stages[name]["ratio_to_ceiling"] > 0, name
    assert stages["end to end: first submit -> last counted"]["reports"] == report["config"]["reports"]
    printed = capsys.readouterr().out
    assert "x the decryption ceiling" in printed and "target < 5%" in printed


def test_library_comparison_runs_and_reports_missing_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    libraries = dict(bench_libraries.LIBRARIES)
    libraries["not-a-library"] = ("deniable_no_such_module", libraries["pure-ldp"][1], "")
    monkeypatch.setattr(bench_libraries, "LIBRARIES", libraries)
    config = LibraryConfig(devices=3000, domain=64, repeats=1, library_budget_s=0.2, max_library_devices=300)
    report = compare(config, progress=False)
    ours = {r["mechanism"]: r for r in report["rows"] if r["implementation"] == "deniable"}
    assert set(ours) == {"grr", "oue", "olh"}
    for row in ours.values():
        assert row["total_s"] > 0 and row["mse"] > 0 and row["theory_variance"] > 0
        assert 0.5 < row["mse_ratio"] < 2  # loose: one run of 64 buckets; no accuracy claim here
    assert "not-a-library" in report["not_installed"]
    text = format_comparison(report)
    assert "not-a-library: not installed, skipped" in text
    for library in ("pure-ldp", "multi-freq-ldpy"):
        if library not in report["not_installed"]:
            assert any(r["implementation"] == library for r in report["rows"])


def test_memory_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    assert main(["bench", "--memory", "--quick", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["shuffler"]["reports"] == report["config"]["reports"]
    assert report["aggregator"]["reports"] == report["config"]["reports"]
    assert report["shuffler"]["peak_rss_mb"] > 0 and report["aggregator"]["peak_rss_mb"] > 0
    assert set(report["within_limits"]) == {"shuffler", "aggregator"}
