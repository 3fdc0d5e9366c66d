"""One gRPC health check, for container HEALTHCHECKs, exec probes and scripts."""

from __future__ import annotations

from deniable.core.plumbing.tls import Transport

SERVICES = {"aggregator": "deniable.v1.Aggregator", "shuffler": "deniable.v1.Shuffler", "server": ""}
"""Health entries by name ("server": the whole server)."""


async def check(address: str, service: str, tls: Transport, timeout: float) -> str:
    """The health status name ``address`` reports for ``service``, or UNREACHABLE(<code>)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from deniable.core.errors import ConfigurationError
    from deniable.core.plumbing.tls import ClientTls, Plaintext, open_channel

    if not isinstance(tls, ClientTls | Plaintext):
        raise ConfigurationError("no TLS configuration for the health check (or --insecure by name)")
    if isinstance(tls, Plaintext):
        channel = open_channel(address, insecure=True)
    else:
        channel = open_channel(address, tls)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    except grpc.aio.AioRpcError as exc:
        return f"UNREACHABLE({exc.code().name})"
    finally:
        await channel.close()
