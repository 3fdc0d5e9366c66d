"""The whole pipeline on one machine: real services on loopback, real HPKE, real SQLite.

Starts an aggregator and a shuffler on free loopback ports in a temporary directory, creates a
binary and an 8-bucket histogram campaign with known true distributions, runs simulated devices
through the client SDK (randomise → encode → seal → outbox → gRPC), flushes the shuffler,
queries the aggregator and compares the estimates with the truth.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.cli.render import answer_json, answer_table, plot_answers, privacy_line
from deniable.client import GrpcTransport, Outbox, Reporter
from deniable.core.service import insecure_channel
from deniable.shuffler import ShufflerConfig, start_shuffler
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

LANGUAGES = ("English", "Spanish", "German", "French", "Japanese", "Portuguese", "Hindi", "Swahili")
LANGUAGE_SHARES = (0.31, 0.20, 0.14, 0.11, 0.09, 0.07, 0.05, 0.03)
DARK_MODE_SHARE = 0.37


@dataclass
class DemoCampaign:
    """One demo question, its true answers, and what the aggregator said."""

    request: pb.CreateCampaignRequest
    truth_values: np.ndarray
    answer: pb.QueryResponse | None = None
    acknowledged: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def true_counts(self) -> list[int]:
        """True number of devices per bucket."""
        cells = max(len(self.request.labels), 2)
        return [int(count) for count in np.bincount(self.truth_values, minlength=cells)]


def exact_population(shares: Sequence[float], devices: int) -> np.ndarray:
    """True values for ``devices`` simulated devices, counts as close to ``shares`` as integers allow.

    Devices are listed bucket by bucket; order carries no information past the shuffler.
    """
    counts = np.floor(np.asarray(shares) * devices).astype(int)
    counts[0] += devices - int(counts.sum())
    return np.repeat(np.arange(len(shares)), counts)


def demo_campaigns(devices: int, epsilon0: float, mechanism: str | None, n_min: int) -> list[DemoCampaign]:
    """The two demo questions with known true distributions."""
    binary_mechanism = pb.BINARY_RR
    histogram_mechanism = pb.GRR
    if mechanism:
        histogram_mechanism = pb.Mechanism.Value(mechanism.upper())
    binary = pb.CreateCampaignRequest(
        id="dark-mode",
        question="Is dark mode on?",
        kind=pb.BINARY,
        mechanism=binary_mechanism,
        epsilon0=epsilon0,
        delta=1e-6,
        n_min=n_min,
    )
    histogram = pb.CreateCampaignRequest(
        id="ui-language",
        question="Which of these 8 languages is the interface in?",
        kind=pb.CATEGORICAL,
        labels=list(LANGUAGES),
        mechanism=histogram_mechanism,
        epsilon0=epsilon0,
        delta=1e-6,
        n_min=n_min,
    )
    return [
        DemoCampaign(binary, exact_population((1 - DARK_MODE_SHARE, DARK_MODE_SHARE), devices)),
        DemoCampaign(histogram, exact_population(LANGUAGE_SHARES, devices)),
    ]


async def _wait_counted(
    stub: pb_grpc.AggregatorAsyncStub, campaign: DemoCampaign, timeout_s: float
) -> pb.QueryResponse:
    """Poll the aggregator until it has counted every acknowledged report (or time runs out)."""
    deadline = time.monotonic() + timeout_s
    rpc = stub.BinarySum if campaign.request.kind == pb.BINARY else stub.Histogram
    while True:
        answer = await rpc(pb.QueryRequest(campaign_id=campaign.request.id), timeout=30)
        if answer.n + answer.rejected >= campaign.acknowledged or time.monotonic() > deadline:
            return answer
        await asyncio.sleep(0.1)


async def run_pipeline(
    devices: int,
    epsilon0: float,
    workdir: Path,
    mechanism: str | None = None,
    progress: bool = True,
) -> list[DemoCampaign]:
    """Run the demo in ``workdir`` and return each campaign with its answer."""
    n_min = max(1, min(1000, devices))
    campaigns = demo_campaigns(devices, epsilon0, mechanism, n_min)
    aggregator = await start_aggregator(
        AggregatorConfig(data_dir=workdir / "aggregator", listen="127.0.0.1:0")
    )
    try:
        shuffler = await start_shuffler(
            ShufflerConfig(data_dir=workdir / "shuffler", upstream=aggregator.address, listen="127.0.0.1:0")
        )
        try:
            channel = insecure_channel(aggregator.address)
            operator = pb_grpc.AggregatorStub(channel)
            for campaign in campaigns:
                await operator.CreateCampaign(campaign.request, timeout=30)
            transport = GrpcTransport(shuffler.address)
            outbox = Outbox(workdir / "devices" / "outbox.db")
            try:
                for campaign in campaigns:
                    started = time.perf_counter()
                    reporter = await Reporter.fetch(campaign.request.id, transport, outbox)
                    reporter.record_many(campaign.truth_values.tolist(), progress=progress)
                    campaign.timings["randomise_seal_s"] = time.perf_counter() - started
                    started = time.perf_counter()
                    result = await reporter.send_pending(progress=progress)
                    campaign.timings["send_s"] = time.perf_counter() - started
                    campaign.acknowledged = result.acknowledged
                    if result.pending or result.rejected:
                        raise RuntimeError(
                            f"{campaign.request.id}: {result.pending} reports still pending,"
                            f" {result.rejected} rejected ({result.rejections})"
                        )
            finally:
                outbox.close()
                await transport.close()
            started = time.perf_counter()
            await shuffler.flush()
            for campaign in campaigns:
                campaign.answer = await _wait_counted(operator, campaign, timeout_s=120)
                campaign.timings["flush_count_s"] = time.perf_counter() - started
            await channel.close()
        finally:
            await shuffler.stop()
    finally:
        await aggregator.stop()
    return campaigns


def demo_report(campaigns: Sequence[DemoCampaign]) -> dict[str, Any]:
    """The ``--json`` document."""
    out = []
    for campaign in campaigns:
        assert campaign.answer is not None
        entry = answer_json(campaign.answer, campaign.true_counts)
        entry["kind"] = "binary" if campaign.request.kind == pb.BINARY else "histogram"
        entry["question"] = campaign.request.question
        entry["acknowledged"] = campaign.acknowledged
        entry["timings_s"] = campaign.timings
        out.append(entry)
    return {"campaigns": out}


def run_demo(
    devices: int = 20_000,
    epsilon0: float = 2.0,
    json_path: Path | None = None,
    plot_path: Path | None = None,
    mechanism: str | None = None,
    workdir: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the demo, print the tables and the privacy statements, write JSON and plot if asked."""
    if devices < 1:
        raise ValueError("--devices must be at least 1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deniable-demo-") as tmp:
        base = workdir or Path(tmp)
        campaigns = asyncio.run(run_pipeline(devices, epsilon0, base, mechanism, progress))
    elapsed = time.perf_counter() - started
    report = demo_report(campaigns)
    report["devices"] = devices
    report["elapsed_s"] = elapsed
    inside = total = 0
    for campaign in campaigns:
        answer = campaign.answer
        assert answer is not None
        print(f"\n{campaign.request.question}  [{campaign.request.id}, {report_mechanism(answer)}]")
        print(answer_table(answer, campaign.true_counts))
        print(f"n = {answer.n} counted of {campaign.acknowledged} acknowledged, {answer.rejected} rejected")
        print("privacy: " + privacy_line(answer.privacy))
        for bucket, truth in zip(answer.buckets, campaign.true_counts, strict=True):
            total += 1
            inside += int(bucket.ci_low <= truth <= bucket.ci_high)
    print(
        f"\n{inside} of {total} true counts lie inside their 95% CI (* marks the others);"
        f" {devices} devices in {elapsed:.1f} s"
    )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {json_path}")
    if plot_path is not None:
        plot_answers(
            [(c.request.question, c.answer, c.true_counts) for c in campaigns if c.answer is not None],
            plot_path,
        )
        print(f"wrote {plot_path}")
    return report


def report_mechanism(answer: pb.QueryResponse) -> str:
    """Mechanism name for the table heading."""
    return pb.Mechanism.Name(answer.mechanism).lower()
