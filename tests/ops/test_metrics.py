"""Request metrics on real servers: every call counted by snake_case RPC and code name (refusals
by other interceptors included), latency histograms, process and build series, pre-initialised
counters; and the Grafana dashboard queries only series the registries export."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import grpc
import pytest

from deniable.aggregator import AggregatorConfig, RunningAggregator, start_aggregator
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.core.plumbing.build import version
from deniable.core.plumbing.certs import DevCerts
from deniable.core.plumbing.metrics import snake_case
from deniable.core.plumbing.tls import open_channel
from deniable.shuffler.metrics import ShufflerMetrics
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "deniable.json"


def sample(metrics: AggregatorMetrics | ShufflerMetrics, name: str, **labels: str) -> float | None:
    """The value of one series in the registry (None when it does not exist)."""
    return metrics.registry.get_sample_value(name, labels)


@pytest.fixture
async def tls_aggregator(tmp_path: Path, dev_certs: DevCerts) -> AsyncIterator[RunningAggregator]:
    tls = dev_certs.server_tls("aggregator")
    running = await start_aggregator(
        AggregatorConfig(data_dir=tmp_path / "agg", listen="127.0.0.1:0", tls=tls)
    )
    yield running
    await running.stop(grace=1.0)


def test_rpc_label_values_are_snake_case() -> None:
    assert snake_case("SubmitReports") == "submit_reports"
    assert snake_case("IngestBatch") == "ingest_batch"
    assert snake_case("Check") == "check"


def test_counters_exist_at_zero_before_any_call() -> None:
    """Dashboards and ratios see every RPC × known code from the start (no missing series)."""
    metrics = ShufflerMetrics()
    for rpc in ("submit_reports", "get_campaign", "flush", "stats"):
        for code in ("OK", "UNAVAILABLE", "INVALID_ARGUMENT"):
            assert sample(metrics, "deniable_requests_total", service="shuffler", rpc=rpc, code=code) == 0.0
    assert sample(metrics, "deniable_build_info", service="shuffler", version=version()) == 1.0
    assert sample(metrics, "process_cpu_seconds_total") is not None
    assert sample(metrics, "deniable_shuffler_forward_duration_seconds_count") == 0.0
    aggregator = AggregatorMetrics()
    assert (
        sample(aggregator, "deniable_requests_total", service="aggregator", rpc="ingest_batch", code="OK")
        == 0.0
    )
    assert sample(aggregator, "deniable_aggregator_decrypt_duration_seconds_count") == 0.0
    assert sample(aggregator, "deniable_aggregator_commit_duration_seconds_count") == 0.0


async def test_every_call_is_counted_with_its_code_and_timed(
    tls_aggregator: RunningAggregator, dev_certs: DevCerts
) -> None:
    """OK, NOT_FOUND (handler), INVALID_ARGUMENT (malformed, refused by an inner interceptor) and
    PERMISSION_DENIED (refused by the auth interceptor before the servicer) all land in requests_total."""
    metrics = tls_aggregator.metrics
    operator = dev_certs.client_tls("aggregator", "aggregator-operator")
    async with open_channel(tls_aggregator.address, operator) as channel:
        stub = pb_grpc.AggregatorStub(channel)
        await stub.ListCampaigns(pb.ListCampaignsRequest(), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.GetCampaign(pb.GetCampaignRequest(campaign_id="nope"), timeout=10)
        raw: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/deniable.v1.Aggregator/ListKeys"
        )
        with pytest.raises(grpc.aio.AioRpcError):
            await raw(b"\xff\xff\xff", timeout=10)
    device = dev_certs.client_tls("aggregator", "shuffler-operator")
    async with open_channel(tls_aggregator.address, device) as wrong_role:
        with pytest.raises(grpc.aio.AioRpcError):
            await pb_grpc.AggregatorStub(wrong_role).ListKeys(pb.ListKeysRequest(), timeout=10)

    def count(rpc: str, code: str) -> float | None:
        return sample(metrics, "deniable_requests_total", service="aggregator", rpc=rpc, code=code)

    # A refused call is counted when the server's side of it ends, which may come just after the
    # client has its status (abort sends it first): wait for the count, briefly (seen once in the
    # fresh container).
    expected = [("list_campaigns", "OK"), ("get_campaign", "NOT_FOUND")]
    expected += [("list_keys", "INVALID_ARGUMENT"), ("list_keys", "PERMISSION_DENIED")]
    deadline = time.monotonic() + 10
    while any(count(*series) != 1.0 for series in expected) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert {series: count(*series) for series in expected} == dict.fromkeys(expected, 1.0)
    assert count("get_campaign", "OK") == 0.0
    timed = sample(
        metrics, "deniable_request_duration_seconds_count", service="aggregator", rpc="get_campaign"
    )
    assert timed == 1.0
    exposition = metrics.exposition().decode()
    assert (
        'deniable_requests_total{code="NOT_FOUND",rpc="get_campaign",service="aggregator"} 1.0' in exposition
    )


def _queried_metrics(dashboard: Mapping[str, object]) -> set[str]:
    """Every metric name a panel's PromQL expression refers to."""
    exprs = re.findall(r'"expr": "((?:[^"\\]|\\.)*)"', json.dumps(dashboard))
    names: set[str] = set()
    for expr in exprs:
        expr = re.sub(r"\{[^}]*\}", "", expr.encode().decode("unicode_escape"))
        for token in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
            if token.startswith(("deniable_", "process_", "python_")):
                names.add(token)
    return names


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def _exported(*registries: AggregatorMetrics | ShufflerMetrics) -> set[str]:
    """Every series name the registries can export (labelled families with no sample yet included)."""
    names: set[str] = set()
    for metrics in registries:
        for family in metrics.registry.collect():
            names.update(s.name for s in family.samples)
            names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def test_the_dashboard_queries_only_metrics_the_services_export() -> None:
    """A renamed metric breaks a panel silently in Grafana; here it fails the build."""
    dashboard = json.loads(DASHBOARD.read_text())
    queried = _queried_metrics(dashboard)
    assert len(queried) >= 10, queried  # the parser found the panels' expressions
    missing = queried - _exported(AggregatorMetrics(), ShufflerMetrics())
    assert not missing, f"the dashboard queries metrics no service exports: {sorted(missing)}"


def test_the_dashboard_check_can_fail() -> None:
    """The check above notices a query of a metric that does not exist."""
    broken = {"panels": [{"targets": [{"expr": "rate(deniable_no_such_metric_total[5m])"}]}]}
    assert _queried_metrics(broken) - _exported(ShufflerMetrics()) == {"deniable_no_such_metric_total"}
