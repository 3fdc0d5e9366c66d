"""Every client pins the peer's role (issue 20 item 2, ADR 0030).

A server is started with each certificate of ``deniable certs dev`` in turn, on the address the
client expects, and each client is configured exactly as the product configures it: a device
trusts only the shuffler's CA, the shuffler's upstream channel only the aggregator's
(``ServerTls.as_client``), an operator only the CA of the party it operates. Only the expected
role completes the handshake. As the control, the old layout (one CA, every certificate with every
usage and every host) lets every impersonation through.

Server side: the aggregator accepts a role only from that role's own party's CA, so a
certificate naming ``aggregator-operator`` from the shuffler's CA is refused (and accepted when the
binding is removed by naming that CA the aggregator's party).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.core.plumbing.certs import DEV_ROLES, DevCerts, issue, make_ca, write_dev_certs
from deniable.core.plumbing.tls import ClientTls, ServerTls, open_channel
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

ALL_ROLES = (*DEV_ROLES, "device")
Client = Callable[[DevCerts], ClientTls]
CLIENTS: dict[str, tuple[str, Client]] = {
    # client: (the only role it may reach, how the product configures it)
    "device": ("shuffler", lambda c: ClientTls(ca=c.ca("shuffler"))),
    "device with a certificate": (
        "shuffler",
        lambda c: ClientTls(ca=c.ca("shuffler"), cert=c.cert("device"), key=c.key("device")),
    ),
    "shuffler upstream": ("aggregator", lambda c: c.server_tls("shuffler").as_client(c.ca("aggregator"))),
    "aggregator operator": ("aggregator", lambda c: c.client_tls("aggregator", "aggregator-operator")),
    "shuffler operator": ("shuffler", lambda c: c.client_tls("shuffler", "shuffler-operator")),
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return write_dev_certs(tmp_path_factory.mktemp("party-certs"), roles=ALL_ROLES)


def _write(directory: Path, name: str, key: object, cert: x509.Certificate) -> None:
    (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(
        key.private_bytes(  # type: ignore[attr-defined]
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


@pytest.fixture(scope="module")
def old_layout(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    """The layout before ADR 0030: one CA for everyone (under every party's file name), every
    certificate with server and client auth and the default hosts."""
    directory = tmp_path_factory.mktemp("old-layout")
    ca_key, ca = make_ca("aggregator")
    for name in ("shuffler-ca", "aggregator-ca", "device-ca", "aggregator-clients-ca", "shuffler-clients-ca"):
        (directory / f"{name}.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    for role in ALL_ROLES:
        _write(directory, role, *issue(ca_key, ca, role, usages=both))
    return DevCerts(directory)


@pytest.fixture
async def serve_as() -> AsyncIterator[Callable[[DevCerts, str], object]]:
    """Start a health server presenting ``role``'s certificate; returns its address."""
    servers: list[grpc.aio.Server] = []

    async def start(certs: DevCerts, role: str) -> str:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        tls = ServerTls(certs.cert(role), certs.key(role), certs.ca("shuffler"))
        port = server.add_secure_port("localhost:0", tls.credentials(require_client_cert=False))
        await server.start()
        servers.append(server)
        return f"localhost:{port}"

    yield start
    for server in servers:
        await server.stop(0)


async def _reaches(address: str, tls: ClientTls) -> bool:
    channel = open_channel(address, tls)
    try:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc  # the handshake failed
        return False
    finally:
        await channel.close()
    return True


async def _matrix(certs: DevCerts, serve_as: Callable[[DevCerts, str], object]) -> dict[str, set[str]]:
    """Client -> the roles whose certificate it accepted as its server."""
    addresses = {role: await serve_as(certs, role) for role in ALL_ROLES}  # type: ignore[misc]
    return {
        client: {role for role, address in addresses.items() if await _reaches(address, make(certs))}
        for client, (_, make) in CLIENTS.items()
    }


async def test_each_client_reaches_only_its_peers_serving_role(
    certs: DevCerts, serve_as: Callable[[DevCerts, str], object]
) -> None:
    """Device facing the aggregator, an operator or a device certificate posing as the shuffler;
    shuffler facing the shuffler, a device or an operator certificate posing as the aggregator;
    operators facing the other party: all refused. Each client reaches its own peer."""
    accepted = await _matrix(certs, serve_as)
    assert accepted == {client: {expected} for client, (expected, _) in CLIENTS.items()}


async def test_the_old_single_ca_layout_let_every_impersonation_through(
    old_layout: DevCerts, serve_as: Callable[[DevCerts, str], object]
) -> None:
    """The control: with one CA and every usage on every certificate, each client accepts every
    role's certificate as its server (what issue 20 reproduced)."""
    accepted = await _matrix(old_layout, serve_as)
    assert accepted == {client: set(ALL_ROLES) for client in CLIENTS}


async def test_a_role_from_another_partys_ca_is_refused_by_the_aggregator(
    tmp_path: Path, certs: DevCerts
) -> None:
    """A CA of the shuffler's party (in the aggregator's client bundle, as it must be for ingest)
    mints ``aggregator-operator``: the aggregator refuses it (UNAUTHENTICATED, wrong_issuer).
    With the binding removed (that CA named the aggregator's party) the same certificate operates."""
    rogue_key, rogue = make_ca("shuffler", "a CA of the shuffler's party")
    _write(tmp_path, "forged", *issue(rogue_key, rogue, "aggregator-operator", ()))
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(certs.ca("aggregator").read_bytes() + rogue.public_bytes(serialization.Encoding.PEM))
    unbound_key, unbound = make_ca("aggregator", "a CA claiming the aggregator's party")
    _write(tmp_path, "unbound", *issue(unbound_key, unbound, "aggregator-operator", ()))
    (tmp_path / "unbound-bundle.pem").write_bytes(
        certs.ca("aggregator").read_bytes() + unbound.public_bytes(serialization.Encoding.PEM)
    )
    for name, bundle_file, expected in (
        ("forged", bundle, grpc.StatusCode.UNAUTHENTICATED),
        ("unbound", tmp_path / "unbound-bundle.pem", grpc.StatusCode.OK),
    ):
        tls = ServerTls(certs.cert("aggregator"), certs.key("aggregator"), bundle_file)
        aggregator = await start_aggregator(
            AggregatorConfig(data_dir=tmp_path / f"agg-{name}", listen="127.0.0.1:0", tls=tls)
        )
        client = ClientTls(
            ca=certs.ca("aggregator"), cert=tmp_path / f"{name}.pem", key=tmp_path / f"{name}.key"
        )
        channel = open_channel(aggregator.address, client)
        try:
            try:
                await pb_grpc.AggregatorStub(channel).ListKeys(pb.ListKeysRequest(), timeout=10)
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                assert "not issued by the CA of that role's party" in (exc.details() or "")
            assert code == expected, name
            refused = aggregator.metrics.registry.get_sample_value(
                "deniable_auth_refusals_total",
                {"service": "aggregator", "rpc": "ListKeys", "reason": "wrong_issuer"},
            )
            assert (refused or 0) == (1 if name == "forged" else 0)
        finally:
            await channel.close()
            await aggregator.stop(grace=1.0)


async def test_the_removed_operator_role_is_refused_with_a_clear_message(
    tmp_path: Path, certs: DevCerts
) -> None:
    """A certificate naming the single ``operator`` role (from a CA the aggregator trusts) is refused
    by the aggregator with a message naming the replacement roles."""
    ca_key, ca = make_ca("aggregator", "an aggregator CA that still issues the old role")
    _write(tmp_path, "old-operator", *issue(ca_key, ca, "operator", ()))
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(certs.ca("shuffler").read_bytes() + ca.public_bytes(serialization.Encoding.PEM))
    tls = ServerTls(certs.cert("aggregator"), certs.key("aggregator"), bundle)
    aggregator = await start_aggregator(
        AggregatorConfig(data_dir=tmp_path / "agg", listen="127.0.0.1:0", tls=tls)
    )
    # the client side refuses to present it at all; a raw channel presents it anyway
    credentials = grpc.ssl_channel_credentials(
        root_certificates=certs.ca("aggregator").read_bytes(),
        private_key=(tmp_path / "old-operator.key").read_bytes(),
        certificate_chain=(tmp_path / "old-operator.pem").read_bytes(),
    )
    channel = grpc.aio.secure_channel(aggregator.address, credentials)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await pb_grpc.AggregatorStub(channel).ListKeys(pb.ListKeysRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "aggregator-operator" in (refused.value.details() or "")
    finally:
        await channel.close()
        await aggregator.stop(grace=1.0)
