"""``deniable loadtest``: completes on a tiny population, counts every acknowledged report, writes
valid PNG plots; arrival patterns have the shape they claim. No timing is asserted."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.logs import preserved_logger

from deniable.cli.main import main
from deniable.sim.benchkit import ServiceProcess
from deniable.sim.loadtest import BURST_FACTOR, BURST_SHARE, BURSTS, arrival_times, resolve_timing


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """``main`` configures the ``deniable`` logger (no propagation): put it back for later tests."""
    with preserved_logger("deniable"):
        yield


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("throughput.png", "latency.png", "estimates.png")


def _check_plots(directory: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image

    for name in PLOTS:
        data = (directory / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        image = matplotlib.image.imread(directory / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, name


def test_loadtest_counts_every_acknowledged_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "plots", tmp_path / "result.json"
    code = main(
        [
            "loadtest",
            "--devices",
            "500",
            "--duration",
            "3",
            "--out",
            str(out),
            "--json",
            str(report),
            "--no-progress",
        ]
    )
    assert code == 0
    result = json.loads(report.read_text())
    assert result["offered"] == 500
    assert result["acknowledged"] == 500 and result["failed_reports"] == 0
    assert result["counted"] == result["acknowledged"] and result["all_acknowledged_counted"]
    assert result["rejected_by_aggregator"] == 0 and result["rejections_by_shuffler"] == {}
    latency = result["latency_ms"]
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert sum(result["acknowledged_per_second"]) * result["bin_s"] == pytest.approx(500)
    accuracy = result["accuracy"]
    assert len(accuracy["buckets"]) == 8
    assert sum(b["true_count"] for b in accuracy["buckets"]) == 500
    _check_plots(out)
    printed = capsys.readouterr().out
    assert "acknowledgement latency: p50" in printed and "every acknowledged report" in printed


def test_loadtest_against_a_running_deployment(tmp_path: Path) -> None:
    aggregator = ServiceProcess(
        "aggregator", {"data_dir": tmp_path / "agg", "listen": "127.0.0.1:0", "decrypt_workers": 0}
    )
    shuffler = None
    try:
        aggregator.start()
        shuffler = ServiceProcess(
            "shuffler",
            {"data_dir": tmp_path / "shuf", "listen": "127.0.0.1:0", "upstream": aggregator.address},
        )
        shuffler.start()
        report = tmp_path / "r.json"
        args = ["loadtest", "--devices", "200", "--duration", "1", "--pattern", "diurnal", "--no-progress"]
        args += ["--shuffler", shuffler.address, "--aggregator", aggregator.address]
        args += ["--out", str(tmp_path / "plots"), "--json", str(report), "--workers", "1"]
        assert main(args) == 0
        result = json.loads(report.read_text())
        assert result["acknowledged"] == result["counted"] == 200
        _check_plots(tmp_path / "plots")
    finally:
        if shuffler is not None:
            shuffler.stop()
        aggregator.stop()


@pytest.mark.parametrize("transport", ["https", "h2"])
def test_loadtest_over_the_https_face_counts_every_report(tmp_path: Path, transport: str) -> None:
    """Devices over HTTPS (TLS, one report per request as a phone would send; HTTP/1.1 or HTTP/2):
    every offered report acknowledged through the HTTPS face and counted once."""
    report = tmp_path / "r.json"
    args = ["loadtest", "--devices", "200", "--duration", "1", "--transport", transport, "--no-progress"]
    args += ["--request-reports", "1", "--out", str(tmp_path / "plots"), "--json", str(report)]
    assert main([*args, "--workers", "1"]) == 0
    result = json.loads(report.read_text())
    assert result["config"]["transport"] == transport
    assert result["acknowledged"] == result["counted"] == 200 and result["failed_reports"] == 0
    assert result["requests"] == 200  # one POST per device: the HTTPS face answered each


@pytest.mark.parametrize(
    "args",
    [
        ["--transport", "https", "--shuffler", "127.0.0.1:1", "--aggregator", "127.0.0.1:2"],
        ["--shuffler", "127.0.0.1:1"],  # without its aggregator
        ["--shuffler", "10.0.0.1:7701", "--aggregator", "127.0.0.1:7700"],  # not loopback
        ["--devices", "10", "--rate", "5", "--duration", "2"],  # all three
    ],
)
def test_loadtest_refuses_bad_targets(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", *args, "--no-progress"]) == 2
    assert "deniable:" in capsys.readouterr().err


def test_timing_from_two_of_devices_rate_duration() -> None:
    assert resolve_timing(None, None, None) == (100_000, 60.0)
    assert resolve_timing(1000, None, None) == (1000, 60.0)
    assert resolve_timing(1000, 100.0, None) == (1000, 10.0)
    assert resolve_timing(None, 100.0, 5.0) == (500, 5.0)
    assert resolve_timing(50, None, 2.0) == (50, 2.0)


# Arrival patterns: each check is at least 6 standard deviations wide (false failure < 1e-8 each).
N = 20_000


@pytest.mark.parametrize("pattern", ["constant", "bursts", "diurnal"])
def test_arrivals_are_sorted_and_inside_the_run(pattern: str) -> None:
    times = arrival_times(pattern, N, 12.0)
    assert times.size == N and bool(np.all(np.diff(times) >= 0))
    assert times[0] >= 0 and times[-1] < 12.0


def _share_check(share: float, expected: float) -> None:
    sd = math.sqrt(expected * (1 - expected) / N)
    assert abs(share - expected) < 6 * sd, (share, expected)


def test_constant_arrivals_are_uniform() -> None:
    times = arrival_times("constant", N, 10.0)
    _share_check(float(np.mean(times < 5.0)), 0.5)


def test_bursts_carry_their_share_of_arrivals() -> None:
    duration = 12.0
    period = duration / BURSTS
    times = arrival_times("bursts", N, duration)
    in_burst = np.mod(times, period) < BURST_SHARE * period
    weight = BURST_FACTOR * BURST_SHARE
    _share_check(float(np.mean(in_burst)), weight / (weight + 1 - BURST_SHARE))


def test_diurnal_arrivals_peak_in_the_middle() -> None:
    duration = 8.0
    times = arrival_times("diurnal", N, duration)
    middle = (times >= duration / 4) & (times < 3 * duration / 4)
    _share_check(float(np.mean(middle)), 0.5 + 0.8 / math.pi / 2 * 2)
