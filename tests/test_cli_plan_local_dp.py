"""The planner says what it trades: local guarantee, central ε, error and device cost per candidate;
``--require-local-dp`` keeps only local randomisers; a shuffle-only choice names the local one."""

from __future__ import annotations

import json

import pytest

from deniable.cli.main import main
from deniable.core import mechanisms
from deniable.core.accounting.planner import plan

PLAN = ["privacy", "plan", "--target-epsilon", "1", "--n", "20000"]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*PLAN, *argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, dict)
    return data


def test_shuffle_only_choice_names_the_local_alternative_and_its_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = _json(capsys, "--domain", "2")
    assert data["mechanism"] == "multi_message_sum" and data["local_guarantee"] is False
    assert data["local_epsilon"] is None
    alternative = data["local_alternative"]
    assert isinstance(alternative, dict) and alternative["mechanism"] == "binary_rr"
    assert alternative["error_ratio_to_chosen"] == pytest.approx(
        alternative["expected_std_error"] / data["expected_std_error"]
    )
    assert alternative["error_ratio_to_chosen"] > 2
    rows = data["candidates"]
    assert isinstance(rows, list)
    for row in rows:
        if row["feasible"]:
            local = mechanisms.mechanism_class(row["mechanism"]).local_privacy
            assert (row["local_epsilon"] is not None) == local
            assert row["messages_per_device"] >= 1 and row["bytes_per_device"] >= 100
    assert main([*PLAN, "--domain", "2"]) == 0
    text = capsys.readouterr().out
    assert "no local guarantee" in text and "best local option, binary_rr" in text
    assert "msgs/device" in text and "bytes/device" in text


def test_require_local_dp_keeps_only_local_randomisers(capsys: pytest.CaptureFixture[str]) -> None:
    """Without the flag a shuffle-only protocol wins at k = 2 and k = 8; with it, only local ones
    are candidates and the choice carries a local epsilon0."""
    for domain in ("2", "8"):
        assert _json(capsys, "--domain", domain)["local_guarantee"] is False
        data = _json(capsys, "--domain", domain, "--require-local-dp")
        assert data["require_local_dp"] is True and data["local_guarantee"] is True
        assert data["local_epsilon"] == data["epsilon0"] and data["local_alternative"] is None
        rows = data["candidates"]
        assert isinstance(rows, list) and rows
        assert all(mechanisms.mechanism_class(row["mechanism"]).local_privacy for row in rows)


def test_library_plan_filters_and_reports_the_trade() -> None:
    chosen = plan(1.0, 1e-6, 20_000, 8)
    assert not chosen.chosen.local_privacy and chosen.local_alternative is not None
    local = plan(1.0, 1e-6, 20_000, 8, require_local_dp=True)
    assert local.mechanism == chosen.local_alternative.mechanism
    assert local.expected_std_error == chosen.local_alternative.expected_std_error
