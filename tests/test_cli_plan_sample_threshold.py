"""``deniable privacy plan`` with sample-and-threshold: planned (s, tau), shown, refused when impossible."""

from __future__ import annotations

import json

import pytest

from deniable.cli.main import main
from deniable.core.mechanisms.sample_threshold import SampleAndThreshold

TARGET = ["--target-epsilon", "1", "--delta", "1e-6", "--n", "100000", "--domain", "200"]


def test_plan_reports_sample_and_threshold_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "plan", *TARGET, "--mechanism", "sample_and_threshold", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mechanism"] == "sample_and_threshold" and data["epsilon"] <= 1.0
    assert data["epsilon0"] == 1.0 and set(data["params"]) == {"sample_rate", "threshold", "delta"}
    pair = {key: data["params"][key] for key in ("sample_rate", "threshold")}
    assert pair in SampleAndThreshold.planning_parameters(1.0, 1e-6, 100_000, 200)
    (row,) = data["candidates"]
    assert row["feasible"] and not row["local_privacy"]

    assert main(["privacy", "plan", *TARGET]) == 0
    table = capsys.readouterr().out
    line = next(row for row in table.splitlines() if row.startswith("sample_and_threshold"))
    assert "sample-and-threshold: the two changed buckets composed jointly" in line
    assert f"threshold={pair['threshold']:g}" in table


def test_plan_refuses_a_target_no_sample_rate_and_threshold_meets(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["privacy", "plan", "--target-epsilon", "0.0005", "--n", "100000", "--domain", "10"]
    assert main([*argv, "--mechanism", "sample_and_threshold"]) == 2
    assert "sample_and_threshold: no parameters meet central epsilon <= 0.0005" in capsys.readouterr().err
