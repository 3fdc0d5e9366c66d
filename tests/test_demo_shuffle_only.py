"""``deniable demo --mechanism balcer_cheu_histogram`` at its defaults (issue 15: it used to refuse),
and the near-central histogram through the whole pipeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deniable.cli.main import main


def _histogram(out: Path) -> dict[str, Any]:
    report = json.loads(out.read_text())
    (histogram,) = [c for c in report["campaigns"] if c["kind"] == "histogram"]
    assert isinstance(histogram, dict)
    return histogram


@pytest.mark.slow
def test_balcer_cheu_demo_runs_at_its_defaults(tmp_path: Path) -> None:
    """20,000 devices, epsilon0 = 2: one batch of every device, the exact profile's guarantee."""
    out = tmp_path / "bc.json"
    assert main(["demo", "--mechanism", "balcer_cheu_histogram", "--no-progress", "--json", str(out)]) == 0
    histogram = _histogram(out)
    assert histogram["n"] == 20_000 and histogram["local_guarantee"] is False
    assert histogram["central_epsilon"] <= 2.0 and histogram["expected_error_ratio"] < 4


def test_multi_message_histogram_demo_is_near_central(tmp_path: Path) -> None:
    """300 devices, epsilon0 = 1 as the central target: every message through the services, the
    expected error within 1.2x central Laplace, the local guarantee shown as none."""
    out = tmp_path / "mh.json"
    argv = ["demo", "--mechanism", "multi_message_histogram", "--devices", "300", "--epsilon0", "1"]
    assert main([*argv, "--no-progress", "--json", str(out)]) == 0
    histogram = _histogram(out)
    assert (
        histogram["n"] == 300 and histogram["local_guarantee"] is False and histogram["local_epsilon"] is None
    )
    assert histogram["central_epsilon"] <= 1.0 and histogram["expected_error_ratio"] <= 1.2
