"""The Python API of deniable.sim: the example of docs/simulation.md runs, and every front door resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import deniable.sim

EXAMPLE_DOC = Path(__file__).resolve().parents[1] / "docs" / "simulation.md"


def documented_example() -> str:
    """The first Python block of docs/simulation.md."""
    match = re.search(r"```python\n(.*?)```", EXAMPLE_DOC.read_text(), re.DOTALL)
    assert match is not None, "docs/simulation.md has no python example"
    return match.group(1)


def test_the_documented_example_runs_at_small_n(capsys: pytest.CaptureFixture[str]) -> None:
    source = documented_example()
    assert "DEVICES = 2000" in source
    namespace: dict[str, object] = {"__name__": "simulation_example"}
    exec(compile(source.replace("DEVICES = 2000", "DEVICES = 300"), str(EXAMPLE_DOC), "exec"), namespace)
    answer = namespace["answer"]
    from deniable.v1 import deniable_pb2 as pb

    assert isinstance(answer, pb.QueryResponse)
    assert answer.n == 300 and answer.messages == 300 and answer.rejected == 0
    assert [bucket.label for bucket in answer.buckets] == ["coffee", "tea", "water"]
    assert answer.privacy.epsilon0 == pytest.approx(2.0)
    printed = capsys.readouterr().out
    assert "coffee" in printed and "privacy:" in printed


def test_simulate_answers_one_campaign() -> None:
    from deniable.v1 import deniable_pb2 as pb

    request = pb.CreateCampaignRequest(
        id="dark",
        question="Dark mode?",
        kind=pb.BINARY,
        mechanism=pb.BINARY_RR,
        epsilon0=2.0,
        delta=1e-6,
        n_min=50,
    )
    answer = deniable.sim.simulate(request, [1] * 60 + [0] * 140)
    assert answer.n == 200 and answer.rejected == 0


def test_every_front_door_is_exported() -> None:
    for name in deniable.sim.__all__:
        assert callable(getattr(deniable.sim, name)), name
    with pytest.raises(AttributeError):
        deniable.sim.no_such_front_door  # noqa: B018
