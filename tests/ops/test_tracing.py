"""OpenTelemetry tracing (ADR 0024): a root span per RPC with the status code, no client identifier
in any span, device-supplied trace context ignored, and nothing of OpenTelemetry when it is off."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.stack import tls_pair

pytest.importorskip("opentelemetry.sdk", reason="the [otel] extra is part of [dev]")  # never skipped in dev

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing import tracing
from deniable.core.plumbing.certs import DevCerts
from deniable.core.plumbing.tls import ClientTls, open_channel
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

DEVICE_TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
TRACEPARENT = f"00-{DEVICE_TRACE_ID:032x}-00f067aa0ba902b7-01"
DEVICE_TAG = "device-7f3a9c"
CIPHERTEXT = bytes.fromhex("c0ffee5eed") * 8
ALLOWED_ATTRIBUTES = {"rpc.system", "rpc.service", "rpc.method", "rpc.grpc.status_code"}


def _recorder() -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _text(span: ReadableSpan) -> str:
    """Everything a span carries that an exporter sends, as one string to search."""
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    return repr((span.name, dict(span.attributes or {}), events, span.status.description, span.links))


async def _device_calls(address: str, ca: Path, campaign_id: str) -> None:
    """A device that tags its calls with a traceparent and an identifier in metadata."""
    metadata = (("traceparent", TRACEPARENT), ("x-device-id", DEVICE_TAG))
    async with open_channel(address, ClientTls(ca=ca)) as channel:
        stub = pb_grpc.ShufflerStub(channel)
        campaign = await stub.GetCampaign(
            pb.GetCampaignRequest(campaign_id=campaign_id), metadata=metadata, timeout=30
        )
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetCampaign(pb.GetCampaignRequest(campaign_id="nope"), metadata=metadata, timeout=30)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        length = campaign.ciphertext_length
        sealed = (CIPHERTEXT * (length // len(CIPHERTEXT) + 1))[:length]
        report = pb.EncryptedReport(campaign_id=campaign_id, key_id=campaign.key_id, ciphertext=sealed)
        request = pb.SubmitReportsRequest(reports=[report])
        answer = await stub.SubmitReports(request, metadata=metadata, timeout=30)
        assert answer.accepted == 1, answer


@pytest.fixture
def recorders() -> Iterator[dict[str, tuple[TracerProvider, InMemorySpanExporter]]]:
    found = {"aggregator": _recorder(), "shuffler": _recorder()}
    yield found
    for provider, _ in found.values():
        provider.shutdown()


async def test_rpc_spans_carry_codes_and_nothing_of_the_device(
    tmp_path: Path, dev_certs: DevCerts, recorders: dict[str, tuple[TracerProvider, InMemorySpanExporter]]
) -> None:
    """Devices through TLS services: spans for their calls and the forward, right codes, root traces
    only (the device's traceparent is ignored, nothing is propagated to the aggregator), no identifier."""

    async with tls_pair(
        tmp_path,
        dev_certs,
        aggregator_options={"tracer_provider": recorders["aggregator"][0]},
        tracer_provider=recorders["shuffler"][0],
    ) as (aggregator, shuffler):
        operator = dev_certs.client_tls("aggregator", "aggregator-operator")
        async with open_channel(aggregator.address, operator) as channel:
            created = pb.CreateCampaignRequest(
                id="traced", question="On?", kind=pb.BINARY, mechanism=pb.BINARY_RR,
                epsilon0=1.0, delta=1e-6, n_min=1,
            )  # fmt: skip
            await pb_grpc.AggregatorStub(channel).CreateCampaign(created, timeout=120)
        await _device_calls(shuffler.address, dev_certs.ca("shuffler"), "traced")
        await shuffler.flush()
    shuffler_spans = recorders["shuffler"][1].get_finished_spans()
    aggregator_spans = recorders["aggregator"][1].get_finished_spans()
    codes = {(s.name, s.attributes.get("rpc.grpc.status_code")) for s in shuffler_spans if s.attributes}
    assert ("deniable.v1.Shuffler/GetCampaign", 0) in codes
    assert ("deniable.v1.Shuffler/GetCampaign", grpc.StatusCode.NOT_FOUND.value[0]) in codes
    assert ("deniable.v1.Shuffler/SubmitReports", 0) in codes
    assert any(s.name == "deniable.v1.Aggregator/CreateCampaign" for s in aggregator_spans)
    ingest = [s for s in aggregator_spans if s.name.endswith("/IngestBatch")]
    assert ingest, [s.name for s in aggregator_spans]
    forwards = [s for s in shuffler_spans if s.name == "shuffler.forward"]
    assert forwards and all(s.parent is None for s in forwards)
    steps = {s.name: s for s in aggregator_spans if s.name.startswith("aggregator.")}
    assert {"aggregator.decrypt", "aggregator.commit"} <= set(steps), [s.name for s in aggregator_spans]
    assert all(s.parent is not None and s.parent.span_id == ingest[0].context.span_id for s in steps.values())
    shuffler_traces = {s.context.trace_id for s in shuffler_spans}
    forbidden = [DEVICE_TAG, CIPHERTEXT.hex(), "127.0.0.1", "ipv4", "ipv6", "peer", "net.", "server."]
    for span in (*shuffler_spans, *aggregator_spans):
        if not span.name.startswith("aggregator."):  # the RPC's own steps are its children
            assert span.parent is None, span.name  # a new root: no device-supplied parent
        assert span.context.trace_id != DEVICE_TRACE_ID
        assert set(span.attributes or {}) <= ALLOWED_ATTRIBUTES, span.attributes
        assert not any(word in _text(span) for word in forbidden), _text(span)
    assert not {s.context.trace_id for s in ingest} & shuffler_traces  # nothing propagated upstream


def test_the_device_traceparent_would_link_calls_if_extracted() -> None:
    """Why the root-span rule matters: the header the test device sends is a valid W3C context that
    a default propagator would adopt as the parent (the attack the test above shows is blocked)."""
    extracted = TraceContextTextMapPropagator().extract({"traceparent": TRACEPARENT})
    assert get_current_span(extracted).get_span_context().trace_id == DEVICE_TRACE_ID


def test_without_the_extra_asking_for_tracing_is_one_configuration_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(ConfigurationError, match=r"otel extra: pip install 'deniable\[otel\]'") as error:
        tracing.tracer_provider("shuffler", console=True)
    assert "\n" not in str(error.value)


def test_no_endpoint_and_no_console_is_no_provider() -> None:
    assert tracing.tracer_provider("aggregator") is None


def test_an_endpoint_builds_a_named_provider_without_touching_the_network() -> None:
    """The exporter connects lazily; the resource names the service (what a collector groups by)."""
    provider = tracing.tracer_provider("shuffler", endpoint="http://127.0.0.1:9")
    assert isinstance(provider, TracerProvider)
    assert provider.resource.attributes["service.name"] == "deniable-shuffler"
    provider.shutdown()


def test_cli_options_follow_the_config_precedence(tmp_path: Path) -> None:
    """DENIABLE_OTEL_ENDPOINT and the file key otel_endpoint feed --otel-endpoint; the flag wins."""
    from deniable.cli import config
    from deniable.cli.main import build_parser

    parser = build_parser()
    (tmp_path / "s.toml").write_text('otel_endpoint = "http://file:4317"\notel_console = true\n')
    base = ["shuffler", "serve", "--data-dir", str(tmp_path), "--upstream", "x:1"]
    base += ["--config", str(tmp_path / "s.toml")]
    env = {"DENIABLE_OTEL_ENDPOINT": "http://env:4317"}
    args = parser.parse_args(base)
    config.resolve(parser, base, args, env)
    assert (args.otel_endpoint, args.otel_console) == ("http://env:4317", True)
    flagged = [*base, "--otel-endpoint", "http://flag:4317"]
    args = parser.parse_args(flagged)
    config.resolve(parser, flagged, args, env)
    assert args.otel_endpoint == "http://flag:4317"


OFF_SCRIPT = """
import asyncio, sys, tempfile
from pathlib import Path
import grpc
from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.v1 import deniable_pb2 as pb, deniable_pb2_grpc as pb_grpc

async def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        agg = await start_aggregator(AggregatorConfig(data_dir=Path(d), listen="127.0.0.1:0", insecure=True))
        async with grpc.aio.insecure_channel(agg.address) as channel:
            await pb_grpc.AggregatorStub(channel).ListCampaigns(pb.ListCampaignsRequest(), timeout=30)
        await agg.stop()
    print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))

asyncio.run(main())
"""


def test_tracing_off_imports_nothing_of_opentelemetry() -> None:
    """Off by default: a served call without a provider loads no OpenTelemetry module at all."""
    done = subprocess.run([sys.executable, "-c", OFF_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
