"""Issue 11's CLI additions for containers: `deniable health` over TLS and secrets from env or files."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import free_port

from deniable.admin.health import check
from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.cli.main import build_parser, main
from deniable.cli.options import secret_from_env, store_dsn
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.certs import DevCerts
from deniable.core.plumbing.tls import ClientTls


async def test_health_speaks_mutual_tls_and_reports_unreachable(tmp_path: Path, dev_certs: DevCerts) -> None:
    tls = dev_certs.server_tls("aggregator")
    running = await start_aggregator(
        AggregatorConfig(data_dir=tmp_path / "agg", listen="127.0.0.1:0", tls=tls)
    )
    own = dev_certs.client_tls("aggregator", "aggregator")
    try:
        assert await check(running.address, "", own, 5.0) == "SERVING"
        assert await check(running.address, "deniable.v1.Aggregator", own, 5.0) == "SERVING"
        # mutual TLS: without a client certificate the handshake fails, so does the check
        anonymous = ClientTls(ca=dev_certs.ca("aggregator"))
        assert (await check(running.address, "", anonymous, 5.0)).startswith("UNREACHABLE")
    finally:
        await running.stop()
    closed = f"127.0.0.1:{free_port()}"
    assert await check(closed, "", own, 2.0) == "UNREACHABLE(UNAVAILABLE)"


def test_health_needs_tls_or_insecure_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "--address", "127.0.0.1:1"]) == 2
    assert "--tls-ca" in capsys.readouterr().err
    assert main(["health", "--address", "127.0.0.1:1", "--insecure", "--tls-ca", "x"]) == 2


def test_store_dsn_from_flag_file_or_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "dsn"
    secret.write_text("postgresql://u:from-file@db/x\n")
    monkeypatch.delenv("DENIABLE_STORE", raising=False)
    monkeypatch.delenv("DENIABLE_STORE_FILE", raising=False)
    assert store_dsn(None, None) is None
    assert store_dsn(None, secret) == "postgresql://u:from-file@db/x"
    monkeypatch.setenv("DENIABLE_STORE_FILE", str(secret))
    assert store_dsn(None, None) == "postgresql://u:from-file@db/x"
    monkeypatch.setenv("DENIABLE_STORE", "postgresql://u:from-env@db/x")
    assert store_dsn(None, None) == "postgresql://u:from-env@db/x"
    assert store_dsn("postgresql://flag@db/x", secret) == "postgresql://flag@db/x"
    with pytest.raises(ConfigurationError, match="cannot read the secret file"):
        store_dsn(None, tmp_path / "missing")
    args = build_parser().parse_args(["aggregator", "serve", "--data-dir", "d", "--store-file", str(secret)])
    assert args.store is None and args.store_file == secret


def test_mqtt_password_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    monkeypatch.delenv("DENIABLE_MQTT_PASSWORD", raising=False)
    monkeypatch.setenv("DENIABLE_MQTT_PASSWORD_FILE", str(tmp_path / "pw"))
    assert secret_from_env("DENIABLE_MQTT_PASSWORD") == "s3cret"


def test_key_group_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DENIABLE_KEY_GROUP", "10001")
    assert build_parser().parse_args(["aggregator", "serve", "--data-dir", "d"]).key_group == 10001
    monkeypatch.delenv("DENIABLE_KEY_GROUP")
    assert build_parser().parse_args(["aggregator", "serve", "--data-dir", "d"]).key_group is None
