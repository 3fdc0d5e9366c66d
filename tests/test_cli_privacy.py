"""``deniable privacy plan|amplify``, planned campaigns and post-processed queries from the command line."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.processes import free_port, wait_listening

from deniable.cli.main import main
from deniable.core import mechanisms

CLI = [sys.executable, "-m", "deniable.cli"]


def _json_out(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, dict)
    return data


def test_plan_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json_out(
        capsys, "privacy", "plan", "--target-epsilon", "1", "--delta", "1e-6", "--n", "5000", "--domain", "4",
        "--json",
    )  # fmt: skip
    for key in ("epsilon", "delta", "analysis", "mechanism", "epsilon0", "expected_std_error"):
        assert key in data, key
    assert data["delta"] == 1e-6 and data["n"] == 5000 and data["domain_size"] == 4
    assert isinstance(data["epsilon"], float) and data["epsilon"] <= 1.0
    # issue 22: the most accurate candidate within 4 kB and 16 messages per device wins: the
    # near-central flooded_histogram (about 4 messages), not the 33-message multi_message_histogram
    assert data["mechanism"] == "flooded_histogram" and data["local_guarantee"] is False
    assert isinstance(data["epsilon0"], float) and data["epsilon0"] == 1.0
    candidates = data["candidates"]
    assert isinstance(candidates, list)
    assert sorted(c["mechanism"] for c in candidates) == mechanisms.names()
    feasible = [
        c
        for c in candidates
        if c["feasible"] and c["messages_per_device"] <= 16 and c["bytes_per_device"] <= 4096
    ]
    assert data["expected_std_error"] == min(c["expected_std_error"] for c in feasible)
    laplace = data["central_laplace"]
    assert isinstance(laplace, dict)
    assert laplace["sensitivity"] == 2.0 and laplace["std_error"] == pytest.approx(2 * math.sqrt(2))


def test_plan_human_output_is_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["privacy", "plan", "--target-epsilon", "1", "--n", "1000", "--domain", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mechanism" in out and "central ε" in out and "std error" in out
    assert "binary_rr" in out and "central Laplace" in out and "chosen:" in out


def test_plan_for_one_mechanism_and_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json_out(
        capsys, "privacy", "plan", "--target-epsilon", "0.5", "--n", "3000", "--domain", "3",
        "--mechanism", "grr", "--json",
    )  # fmt: skip
    assert data["mechanism"] == "grr" and data["epsilon"] <= 0.5
    assert main(["privacy", "plan", "--target-epsilon", "1", "--n", "100", "--domain", "5",
                 "--mechanism", "binary_rr"]) == 2  # fmt: skip
    assert "no mechanism reaches" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["privacy", "plan", "--target-epsilon", "0", "--n", "100", "--domain", "2"])
    with pytest.raises(SystemExit):
        main(["privacy", "plan", "--target-epsilon", "1", "--n", "100", "--domain", "1"])


def test_amplify_json_lists_every_analysis(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json_out(
        capsys, "privacy", "amplify", "--mechanism", "binary_rr", "--epsilon0", "3", "--n", "5000",
        "--delta", "1e-6", "--json",
    )  # fmt: skip
    for key in ("epsilon", "delta", "analysis", "analyses"):
        assert key in data, key
    rows = data["analyses"]
    assert isinstance(rows, list)
    names = {row["analysis"] for row in rows}
    assert {"binary RR exact", "GRR privacy blanket (numerical)"} <= names
    assert any("FMT 2021" in name for name in names)
    amplified = [row["epsilon"] for row in rows if row["amplified"]]
    assert data["epsilon"] == pytest.approx(min(amplified))
    assert data["analysis"] == next(r["analysis"] for r in rows if r["epsilon"] == min(amplified))
    assert data["epsilon"] < 3.0 and data["delta"] == 1e-6


def test_amplify_human_and_local_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "amplify", "--mechanism", "grr", "--epsilon0", "2", "--n", "3000",
                 "--domain", "8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "GRR privacy blanket" in out and "tightest:" in out
    data = _json_out(
        capsys, "privacy", "amplify", "--mechanism", "grr", "--epsilon0", "5", "--n", "2", "--domain", "3",
        "--json",
    )  # fmt: skip
    assert data["epsilon"] == 5.0 and data["delta"] == 0.0 and data["amplified"] is False
    assert main(["privacy", "amplify", "--mechanism", "nope", "--epsilon0", "1", "--n", "10"]) == 2


def test_privacy_mechanisms_still_lists_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "mechanisms"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in mechanisms.names())
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    for name in mechanisms.names():
        local = mechanisms.mechanism_class(name).local_privacy
        assert ("central only (no local DP)" in lines[name]) != local, name


def test_campaign_create_needs_exactly_one_way(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["campaign", "create", "--id", "x", "--question", "q", "--kind", "binary"]
    with pytest.raises(SystemExit):
        main(base)  # neither
    with pytest.raises(SystemExit):
        main([*base, "--epsilon0", "1", "--target-epsilon", "1", "--expected-n", "10"])  # both
    assert main([*base, "--target-epsilon", "1"]) == 2  # target without expected n
    assert "--expected-n" in capsys.readouterr().err


# ---------------------------------------------------------------- against a served aggregator


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[str]:
    """``deniable aggregator serve`` as a subprocess (plaintext by name: these tests are about planning)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *CLI,
            "aggregator",
            "serve",
            "--insecure",
            "--data-dir",
            str(tmp_path / "agg"),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_listening(port, proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    remote = ("--insecure",) if args and args[0] in ("campaign", "query", "keys") else ()
    return subprocess.run([*CLI, *args, *remote], capture_output=True, text=True, timeout=120, check=False)


def test_planned_campaign_and_post_processed_query(aggregator: str) -> None:
    created = _cli(
        "campaign", "create", "--aggregator", aggregator, "--id", "lang", "--question", "Language?",
        "--kind", "categorical", "--labels", "en,es,de", "--target-epsilon", "1", "--expected-n", "3000",
        "--json",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    campaign = json.loads(created.stdout)
    assert campaign["target_epsilon"] == 1.0 and campaign["expected_n"] == 3000
    # n_min counts messages: what 3000 devices' worth needs (the most one device sends, or for a
    # varying count like flooded_histogram's a count fewer devices do not reach: ADR 0045)
    chosen = mechanisms.create(
        campaign["mechanism"], epsilon0=campaign["epsilon0"], domain_size=3, **campaign["params"]
    )
    assert campaign["n_min"] == chosen.message_threshold(3000) and campaign["epsilon0"] >= 1.0
    assert campaign["local_guarantee"] == chosen.local_privacy
    shown = _cli("campaign", "show", "lang", "--aggregator", aggregator, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["local_epsilon"] == (
        campaign["epsilon0"] if chosen.local_privacy else None
    )
    text = _cli("campaign", "show", "lang", "--aggregator", aggregator)
    assert text.returncode == 0 and "local guarantee:" in text.stdout and "central guarantee:" in text.stdout
    assert ("no local guarantee" in text.stdout) != chosen.local_privacy
    human = _cli(
        "campaign", "create", "--aggregator", aggregator, "--id", "dark", "--question", "Dark?",
        "--kind", "binary", "--mechanism", "grr", "--target-epsilon", "0.5", "--expected-n", "2000",
    )  # fmt: skip
    assert human.returncode == 0, human.stderr
    assert "planned:" in human.stdout
    answer = _cli(
        "query", "histogram", "lang", "--aggregator", aggregator, "--simultaneous", "--simplex", "--clip",
        "--suppress-below", "5", "--top-k", "2", "--json",
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    data = json.loads(answer.stdout)
    assert data["simultaneous"] is True
    assert data["post_processing_applied"] == [
        "project_simplex",
        "clip_non_negative",
        "suppress_below(5)",
        "top_k(2)",
    ]
    assert all("processed" in b and "suppressed" in b for b in data["buckets"])
    table = _cli("query", "histogram", "lang", "--aggregator", aggregator, "--clip")
    assert table.returncode == 0, table.stderr
    assert "processed" in table.stdout and "clip_non_negative" in table.stdout
    refused = _cli("query", "histogram", "lang", "--aggregator", aggregator, "--top-k", "4")
    assert refused.returncode == 1 and "INVALID_ARGUMENT" in refused.stderr and "top_k" in refused.stderr


def test_demo_plans_and_compares_with_central_laplace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo.json"
    argv = ["demo", "--devices", "1500", "--target-epsilon", "1", "--delta", "1e-6", "--no-progress"]
    assert main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "planned by the aggregator" in printed and "Laplace" in printed
    report = json.loads(out.read_text())
    assert report["target_epsilon"] == 1.0
    for campaign in report["campaigns"]:
        for key in ("id", "kind", "mechanism", "epsilon0", "central_epsilon", "delta", "n", "buckets"):
            assert key in campaign, key
        local = mechanisms.mechanism_class(campaign["mechanism"]).local_privacy
        assert campaign["local_guarantee"] is local  # both guarantees, apart (issue 15)
        assert campaign["local_epsilon"] == (campaign["epsilon0"] if local else None)
        planned = campaign["planned"]
        assert planned["expected_n"] == 1500 and planned["epsilon0"] == campaign["epsilon0"]
        assert planned["central_epsilon"] <= 1.0
        assert campaign["central_epsilon"] <= 1.0, "one shuffle of every device meets the target"
        assert campaign["epsilon0"] >= 1.0  # equal for a shuffle-only protocol
        k = len(campaign["buckets"])
        laplace = (1.0 if k == 2 else 2.0) * math.sqrt(2) / campaign["central_epsilon"]
        assert campaign["central_laplace_std_error"] == pytest.approx(laplace)
        assert campaign["error_ratio"] == pytest.approx(campaign["observed_rmse"] / laplace)
        # The Polya multi-message sum adds exactly discrete Laplace noise, whose standard
        # deviation at the same eps is below the continuous Laplace's: that is the floor (to
        # 1e-4: the stated eps spends a little of delta, so it sits just under the noise's ln(1/a)).
        a = math.exp(-campaign["central_epsilon"])
        floor = (math.sqrt(2 * a) / (1 - a)) / (math.sqrt(2) / campaign["central_epsilon"])
        assert campaign["expected_error_ratio"] >= floor * (1 - 1e-4), "beats the trusted curator"


def test_profile_json_table_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "profile.png"
    data = _json_out(
        capsys,
        "privacy",
        "profile",
        "--mechanism",
        "grr",
        "--epsilon0",
        "3",
        "--n",
        "20000",
        "--domain",
        "8",
        "--points",
        "6",
        "--plot",
        str(plot),
        "--json",
    )
    assert set(data) >= {"mechanism", "epsilon0", "n", "domain_size", "profile", "guarantee", "params"}
    rows = data["profile"]
    assert isinstance(rows, list) and len(rows) == 6
    deltas = [row["delta"] for row in rows]
    assert deltas == sorted(deltas, reverse=True) and 0 < deltas[0] <= 1
    guarantee = data["guarantee"]
    assert isinstance(guarantee, dict) and "blanket" in guarantee["analysis"]
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"
    # the stated guarantee lies on the curve: delta(eps_stated) <= 1e-6
    mech = mechanisms.create("grr", epsilon0=3.0, domain_size=8)
    assert mech.privacy_profile(20_000, guarantee["epsilon"]) <= 1e-6 * (1 + 1e-6)

    assert (
        main(
            [
                "privacy",
                "profile",
                "--mechanism",
                "multi_message_sum",
                "--epsilon0",
                "1",
                "--n",
                "5000",
                "--epsilon",
                "0.5",
                "--epsilon",
                "1.5",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "0.5000" in printed and "1.5000" in printed and "Polya" in printed
    assert (
        main(["privacy", "profile", "--mechanism", "grr", "--epsilon0", "1", "--n", "100", "--epsilon", "-1"])
        == 2
    )
    assert "must be a finite number" in capsys.readouterr().err


def test_amplify_builds_shuffle_only_protocols_for_n(capsys: pytest.CaptureFixture[str]) -> None:
    """A shuffle-only protocol is calibrated to the given n and delta (it needs expected_n)."""
    data = _json_out(
        capsys,
        "privacy",
        "amplify",
        "--mechanism",
        "multi_message_sum",
        "--epsilon0",
        "1",
        "--n",
        "5000",
        "--json",
    )
    assert data["local_privacy"] is False and data["amplified"] is True
    assert 0.99 < float(data["epsilon"]) <= 1.0 and "Polya" in str(data["analysis"])


def test_plan_budget_flags_let_the_costly_protocol_win(capsys: pytest.CaptureFixture[str]) -> None:
    """Raising the per-device budget picks the most accurate candidate whatever its cost."""
    data = _json_out(
        capsys, "privacy", "plan", "--target-epsilon", "1", "--delta", "1e-6", "--n", "5000", "--domain", "4",
        "--mechanism", "flooded_histogram", "--mechanism", "multi_message_histogram",
        "--max-messages-per-device", "1000", "--max-bytes-per-device", "1e9", "--json",
    )  # fmt: skip
    assert data["mechanism"] == "multi_message_histogram"
