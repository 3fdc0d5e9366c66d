"""End to end through real gRPC servers on loopback: devices → shuffler → aggregator → query."""

from __future__ import annotations

from pathlib import Path

import pytest

from deniable.core.plumbing.mqtt import BrokerAddress
from deniable.sim.demo import run_pipeline
from deniable.v1 import deniable_pb2 as pb


async def test_every_acknowledged_report_is_counted_and_cis_cover_the_truth(tmp_path: Path) -> None:
    """4,000 devices answer two campaigns; counted == acknowledged; truths inside their 95% CIs.

    Ten buckets, each covered with probability ≈ 0.95: at least 6 inside fails with probability
    P(Binomial(10, 0.95) ≤ 5) ≈ 6e-5 (coverage of the normal interval at this n is ≈ 0.95).
    """
    campaigns = await run_pipeline(devices=4000, epsilon0=2.0, workdir=tmp_path, progress=False)
    inside = 0
    for campaign in campaigns:
        answer = campaign.answer
        assert answer is not None
        assert campaign.acknowledged == 4000
        assert answer.n == campaign.acknowledged
        assert answer.rejected == 0
        assert answer.privacy.epsilon0 == pytest.approx(2.0)
        assert answer.privacy.smallest_batch == 4000
        assert answer.privacy.amplified and 0 < answer.privacy.central_epsilon < 2.0
        assert answer.privacy.delta == pytest.approx(1e-6)
        truth = campaign.true_counts
        assert len(answer.buckets) == len(truth)
        assert sum(b.raw_count for b in answer.buckets) == 4000
        for bucket, true_count in zip(answer.buckets, truth, strict=True):
            assert bucket.ci_low < bucket.estimate < bucket.ci_high
            inside += int(bucket.ci_low <= true_count <= bucket.ci_high)
    assert inside >= 6


async def test_binary_estimates_sum_to_n(tmp_path: Path) -> None:
    """The two buckets of a binary campaign are complementary estimates: they add up to n."""
    campaigns = await run_pipeline(devices=1500, epsilon0=1.0, workdir=tmp_path, progress=False)
    binary = next(c for c in campaigns if c.request.kind == pb.BINARY)
    assert binary.answer is not None
    no, yes = binary.answer.buckets
    assert no.estimate + yes.estimate == pytest.approx(1500, abs=1e-6)


async def test_devices_on_an_mqtt_broker_are_counted_like_grpc_ones(
    tmp_path: Path, mqtt_broker: BrokerAddress, mqtt_prefix: str
) -> None:
    """2,000 devices reach the shuffler through mosquitto (campaigns from retained topics, reports
    and answers as messages): every acknowledged report is counted once, CIs as over gRPC.

    Ten buckets each covered w.p. ≈ 0.95: at least 6 inside fails w.p. ≈ 6e-5."""
    campaigns = await run_pipeline(
        devices=2000,
        epsilon0=2.0,
        workdir=tmp_path,
        progress=False,
        mqtt_broker=mqtt_broker,
        mqtt_prefix=mqtt_prefix,
        mqtt_insecure=True,  # a plaintext test broker; TLS to one: tests/client/test_mqtt_transport.py
    )
    inside = 0
    for campaign in campaigns:
        answer = campaign.answer
        assert answer is not None
        assert campaign.acknowledged == answer.n == 2000
        assert answer.rejected == 0
        for bucket, true_count in zip(answer.buckets, campaign.true_counts, strict=True):
            inside += int(bucket.ci_low <= true_count <= bucket.ci_high)
    assert inside >= 6
