"""``deniable bench --pipeline`` runs side by side through the services, and the demo names a
heavy protocol before starting it (issue 22 item 3). No timing is asserted: only that the run
measured what it says (every acknowledged message counted, rates positive, ratios relative to the
single-message reference)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from deniable.cli.main import main
from deniable.core.accounting.planner import device_cost
from deniable.core.campaigns import randomiser_for
from deniable.sim.bench_pipeline import (
    PipelineConfig,
    PipelineRow,
    campaign_request,
    devices_for,
    mean_messages,
    pipeline_text,
)
from deniable.sim.demo import heavy_note
from deniable.v1 import deniable_pb2 as pb


@pytest.mark.slow
def test_pipeline_bench_quick_reports_messages_beside_reports(tmp_path: Path) -> None:
    """The whole quick run through the services (about a minute quiet, three on a loaded machine)."""
    out = tmp_path / "pipeline.json"
    assert main(["bench", "--pipeline", "--quick", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [r["mechanism"] for r in rows] == ["grr", "flooded_histogram"]
    assert rows[0]["messages"] == rows[0]["devices"] and rows[0]["services_ratio"] == 1.0
    assert rows[1]["messages"] > rows[1]["devices"]  # several messages a device, all counted
    for row in rows:
        assert row["services_rate"] > 0 and row["end_to_end_rate"] > 0
        seconds = row["send_s"] + row["release_count_s"]
        assert math.isclose(row["services_rate"] * seconds, row["messages"], rel_tol=1e-9)


@pytest.mark.slow
def test_pipeline_devices_meet_the_message_budget_and_all_reach_one_release() -> None:
    """The sizing and the campaign the bench creates, no services (slow: every bisection step
    calibrates a shuffle protocol for its n, about two minutes on a loaded machine)."""
    config = PipelineConfig(domain=8, messages=3000)
    for name in ("grr", "multi_message_histogram"):
        devices = devices_for(name, config)
        sent = devices * mean_messages(name, config.domain, devices, config.delta)
        assert 0.97 * config.messages <= sent <= 1.1 * config.messages, (name, devices, sent)
        request = campaign_request(name, config, devices)
        assert request.batch_target == devices and len(request.labels) == 8
    # flooded_histogram has no bound on one device's messages: its batch target (in messages,
    # `most or 1` per device) must not be reached before every device has sent.
    flooded = campaign_request("flooded_histogram", config, 500)
    assert flooded.batch_target >= 100 * config.messages


def test_pipeline_table_shows_each_ratio_to_the_reference() -> None:
    rows = [
        PipelineRow("grr", 10, 10, 1.0, 1.0, 1.0, 1.0, 5.0, 2.5, 1.0, 1.0),
        PipelineRow("flooded_histogram", 2, 20, 10.0, 1.0, 1.0, 1.0, 10.0, 5.0, 2.0, 2.0),
    ]
    text = pipeline_text(rows, PipelineConfig(domain=8))
    assert "d = 8" in text and "reports/s for grr" in text
    assert text.splitlines()[3].split()[-4:] == ["10", "2.00", "5", "2.00"]


def _campaign(mechanism: str, labels: int) -> pb.Campaign:
    return pb.Campaign(
        id="c",
        kind=pb.CATEGORICAL,
        labels=[f"b{i}" for i in range(labels)],
        mechanism=pb.Mechanism.Value(mechanism.upper()),
        epsilon0=1.0,
        delta=1e-6,
        params={"expected_n": 20_000.0, "delta": 1e-6},
    )


def test_the_demo_names_a_protocol_over_the_device_budget() -> None:
    heavy = _campaign("multi_message_histogram", 32)
    note = heavy_note(heavy, 20_000)
    messages = device_cost(randomiser_for(heavy))["messages_per_device"]
    assert messages > 16
    assert note is not None and "heavy protocol" in note and f"{messages * 20_000:,.0f} messages" in note


def test_the_demo_says_nothing_extra_for_a_single_message_mechanism() -> None:
    light = _campaign("grr", 8)
    light.params.clear()
    assert heavy_note(light, 20_000) is None
