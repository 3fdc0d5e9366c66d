"""Server lifecycle, configuration errors, campaign relay, metrics, exports and the import boundary."""

from __future__ import annotations

import ast
import asyncio
import runpy
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from support import astutil
from support.imports import lint_imports

from deniable.core.errors import ConfigurationError
from deniable.shuffler.server import ShufflerConfig, start_shuffler
from deniable.v1 import deniable_pb2 as pb

SHUFFLER_DIR = Path(__file__).resolve().parents[2] / "shuffler"
FORBIDDEN = (
    "deniable.core.mechanisms",
    "deniable.core.crypto",
    "deniable.core.campaigns",
    "deniable.core.wire",
    "deniable.core.accounting",
    "deniable.aggregator",
    "deniable.client",
    "cryptography.hazmat.primitives.hpke",
)


async def test_port_taken_is_a_configuration_error(tmp_path: Path, upstream, start) -> None:
    first = await start()
    with pytest.raises(ConfigurationError) as taken:
        await start_shuffler(
            ShufflerConfig(
                insecure=True, data_dir=tmp_path / "other", upstream=upstream.address, listen=first.address
            )
        )
    assert "\n" not in str(taken.value)
    # The failed start released its spool: the directory can be used again at once.
    again = await start_shuffler(
        ShufflerConfig(
            insecure=True, data_dir=tmp_path / "other", upstream=upstream.address, listen="127.0.0.1:0"
        )
    )
    await again.stop()


async def test_unusable_data_dir_is_a_configuration_error(tmp_path: Path, upstream) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigurationError) as bad:
        await start_shuffler(
            ShufflerConfig(
                insecure=True, data_dir=blocker / "spool", upstream=upstream.address, listen="127.0.0.1:0"
            )
        )
    assert "\n" not in str(bad.value)


async def test_address_and_stop_twice(start) -> None:
    shuffler = await start()
    assert shuffler.address == f"127.0.0.1:{shuffler.port}"
    await shuffler.stop()
    await shuffler.stop()


async def test_relays_get_campaign_and_list_campaigns(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    a = upstream.fake.add(kit.make_campaign("a"))
    b = upstream.fake.add(kit.make_campaign("b", n_min=9))
    stub = channel_to(await start())
    assert await stub.GetCampaign(pb.GetCampaignRequest(campaign_id="a")) == a
    listed = await stub.ListCampaigns(pb.ListCampaignsRequest())
    assert list(listed.campaigns) == [a, b]
    for missing in ("nope", "Not A Valid Id!"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetCampaign(pb.GetCampaignRequest(campaign_id=missing))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_list_falls_back_to_the_cache_when_upstream_is_down(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    a = upstream.fake.add(kit.make_campaign("a"))
    b = upstream.fake.add(kit.make_campaign("b"))
    stub = channel_to(await start())
    await stub.ListCampaigns(pb.ListCampaignsRequest())
    upstream.fake.fail_campaign_calls = True
    assert list((await stub.ListCampaigns(pb.ListCampaignsRequest())).campaigns) == [a, b]
    assert await stub.GetCampaign(pb.GetCampaignRequest(campaign_id="b")) == b


async def test_list_with_upstream_down_and_empty_cache_is_unavailable(upstream, start, channel_to) -> None:
    upstream.fake.fail_campaign_calls = True
    stub = channel_to(await start())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListCampaigns(pb.ListCampaignsRequest())
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_stats_rpc(upstream, start, channel_to, kit: SimpleNamespace) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=50))
    stub = channel_to(await start())
    await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 4)))
    stats = await stub.Stats(pb.ShufflerStatsRequest())
    assert [(c.campaign_id, c.pending, c.in_flight) for c in stats.campaigns] == [("c1", 4, 0)]


async def test_metrics_endpoint(upstream, start, kit: SimpleNamespace) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=2))
    shuffler = await start(metrics_port=0)
    await shuffler.handlers.submit(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 2)))
    await shuffler.flush()
    assert shuffler.metrics_port
    url = f"http://127.0.0.1:{shuffler.metrics_port}/metrics"
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    for line in (
        "deniable_shuffler_reports_accepted_total 2.0",
        "deniable_shuffler_batches_forwarded_total 1.0",
        "deniable_shuffler_pending_reports 0.0",
        "deniable_shuffler_forward_failures_total 0.0",
    ):
        assert line in body


async def test_metrics_bind_the_listen_host_not_loopback(upstream, start) -> None:
    """Prometheus scrapes the pod address: metrics follow --listen's host (127.0.0.2 here), so a
    hard-coded 127.0.0.1 (the old behaviour) would refuse this connection."""
    shuffler = await start(listen="127.0.0.2:0", metrics_port=0)
    url = f"http://127.0.0.2:{shuffler.metrics_port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    assert "deniable_shuffler_pending_reports" in body
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{shuffler.metrics_port}/metrics", timeout=5)


async def test_the_removed_row_spool_is_a_one_line_configuration_error(tmp_path: Path, upstream) -> None:
    with pytest.raises(ConfigurationError) as bad:
        await start_shuffler(
            ShufflerConfig(
                insecure=True,
                data_dir=tmp_path,
                upstream=upstream.address,
                listen="127.0.0.1:0",
                spool="rows",
            )
        )
    message = str(bad.value)
    assert "\n" not in message and "removed" in message and '"segments"' in message
    assert not (tmp_path / "spool.sqlite3").exists()  # refused before anything was opened


def test_package_exports() -> None:
    exported = runpy.run_path(str(SHUFFLER_DIR / "__init__.py"))
    assert set(exported["__all__"]) == {
        "ShufflerConfig",
        "start_shuffler",
        "serve_shuffler",
        "RunningShuffler",
    }
    assert all(name in exported for name in exported["__all__"])


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(astutil.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_shuffler_source_never_imports_decryption_or_other_services() -> None:
    """Imports: import-linter's ``shuffler-blind`` (also indirect), ``sides-independent`` and ``layers``
    contracts (ADR 0028), plus a direct check for the external HPKE module they cannot name.
    The address: quota.py keeps only a keyed hash of it; the gRPC peer is read there, the HTTPS
    face's peer host goes straight into it."""
    code, output = lint_imports(["shuffler-blind", "sides-independent", "layers"])
    assert code == 0, output
    sources = sorted(SHUFFLER_DIR.glob("*.py"))
    assert len(sources) >= 9
    for path in sources:
        for name in _imported_modules(path):
            assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), (path.name, name)
        text = path.read_text()
        if path.name == "quota.py":  # the one reader of the address: it keeps only a keyed hash of it
            uses = [line for line in text.splitlines() if "peer()" in line and "``" not in line]
            assert uses and all("_digest(" in line for line in uses), uses
            continue
        if path.name == "https.py":  # the HTTPS face hands the peer's host straight to that hash
            uses = [
                line
                for line in text.splitlines()
                if (".client" in line or '"client"' in line) and "``" not in line and '"""' not in line
            ]
            allowed = (
                "quota.address_keys(request.client)",
                "request.client is None",
                'client = scope.get("client")',  # ASGI's (host, port), read into Request.client only
            )
            assert uses and all(any(a in line for a in allowed) for line in uses), uses
        assert "peer(" not in text.replace("``context.peer()``", ""), path.name
        assert "invocation_metadata" not in text, path.name


def test_importing_the_shuffler_loads_nothing_forbidden() -> None:
    program = (
        "import sys, runpy\n"
        "import deniable.shuffler.server, deniable.shuffler.handlers, deniable.shuffler.forwarder\n"
        f"runpy.run_path({str(SHUFFLER_DIR / '__init__.py')!r})\n"
        f"forbidden = {FORBIDDEN!r}\n"
        "bad = sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in forbidden))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == ""
