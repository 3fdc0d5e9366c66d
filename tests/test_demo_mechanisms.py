"""Every registered mechanism runs through the demo and the services, and says what it guarantees.

The default run uses a few hundred devices per mechanism (seconds each): the demo must exit 0,
write strict JSON (no Infinity/NaN: where no theorem applies at the achieved n the JSON holds null
and a reason) and the plot, and put every device in one batch. The slow run uses the defaults
(20,000 devices) and checks that the stated central ε is the one planned at the batch target.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from deniable.cli.main import main
from deniable.core import mechanisms

MECHANISMS = sorted(mechanisms.names())
SMALL_N = {"balcer_cheu_histogram": 2000}
"""Devices per mechanism in the quick run: Balcer–Cheu's theorem needs n ≥ 1521 at ε = 2, δ = 1e-6."""


def _strict(text: str) -> Any:
    """Parse JSON refusing the non-standard constants Python's json would accept."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def _run_demo(tmp_path: Path, mechanism: str, devices: int | None) -> tuple[dict[str, Any], Path]:
    out, plot = tmp_path / f"{mechanism}.json", tmp_path / f"{mechanism}.png"
    argv = ["demo", "--mechanism", mechanism, "--json", str(out), "--plot", str(plot), "--no-progress"]
    if devices is not None:
        argv += ["--devices", str(devices)]
    assert main(argv) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return _strict(out.read_text()), plot


def _check_statement(entry: dict[str, Any], devices: int) -> None:
    """One batch of every device; ε finite, or null with a reason in words."""
    assert (entry["smallest_batch"], entry["batches"], entry["batch_target"]) == (devices, 1, devices)
    if entry["central_epsilon"] is None:
        assert entry["central_epsilon_unavailable"], entry
    else:
        assert math.isfinite(entry["central_epsilon"]) and entry["central_epsilon_unavailable"] is None


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_demo_runs_every_mechanism_at_small_n(tmp_path: Path, mechanism: str) -> None:
    devices = SMALL_N.get(mechanism, 300)
    report, _ = _run_demo(tmp_path, mechanism, devices)
    for entry in report["campaigns"]:
        _check_statement(entry, devices)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # multi_message_histogram seals and counts 1.3M messages
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_demo_at_defaults_states_the_planned_epsilon(tmp_path: Path, mechanism: str) -> None:
    """20,000 devices (the default): the stated central ε is no worse than the plan for that n."""
    report, _ = _run_demo(tmp_path, mechanism, None)
    for entry in report["campaigns"]:
        _check_statement(entry, 20_000)
        plan = entry["plan_at_target"]
        assert plan["batch_target"] == 20_000
        if plan["central_epsilon"] is not None:
            assert entry["central_epsilon"] is not None
            assert entry["central_epsilon"] <= plan["central_epsilon"] * (1 + 1e-9), entry


def test_no_finite_epsilon_is_null_with_a_reason_in_json_and_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no analysis gives a finite ε at the achieved n (issue 9: Balcer–Cheu planned for 20,000
    devices, counted in batches of 4,533), the answer says why and the JSON holds null, never
    Infinity. The mechanism's analysis is stubbed so the test does not depend on its range."""
    from deniable.aggregator.queries import privacy_statement
    from deniable.core.amplification.shuffle import AmplificationBound
    from deniable.core.mechanisms.balcer_cheu import BalcerCheuHistogram
    from deniable.sim.render import answer_json, dumps, privacy_line
    from deniable.v1 import deniable_pb2 as pb

    reason = "not applicable: n=4533 is outside the theorem's range"
    bound = AmplificationBound(math.inf, 1e-6, "Balcer-Cheu 2020 histogram theorem", False, reason)
    monkeypatch.setattr(BalcerCheuHistogram, "central_guarantee", lambda self, n, delta: bound)
    campaign = pb.Campaign(
        id="bc",
        kind=pb.CATEGORICAL,
        labels=[str(i) for i in range(8)],
        mechanism=pb.BALCER_CHEU_HISTOGRAM,
        epsilon0=2.0,
        delta=1e-6,
        n_min=1000,
        batch_target=200_000,
        params={"expected_n": 20_000.0, "delta": 1e-6},
    )
    statement = privacy_statement(campaign, 4533, 4533, 4)
    assert math.isinf(statement.central_epsilon) and statement.epsilon_unavailable == reason
    answer = pb.QueryResponse(campaign_id="bc", mechanism=campaign.mechanism, n=4533, privacy=statement)
    data = _strict(dumps(answer_json(answer)))
    assert data["central_epsilon"] is None and data["central_epsilon_unavailable"] == reason
    assert (data["batch_target"], data["batches"], data["smallest_batch"]) == (20_000, 4, 4533)
    assert "below the campaign's batch target" in data["privacy_note"]
    assert "no central guarantee can be stated" in privacy_line(statement)
    with pytest.raises(ValueError):  # what strict JSON does with the raw value
        json.dumps(statement.central_epsilon, allow_nan=False)
