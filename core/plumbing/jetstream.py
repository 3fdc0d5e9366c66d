"""NATS JetStream between shufflers and aggregator workers: the one stream, subject and consumer.

Optional (the ``[nats]`` extra): gRPC forwarding stays the default. A shuffler publishes each
batch's ``ShuffledBatch`` bytes with ``Nats-Msg-Id`` = batch id (JetStream drops a repeat within
the duplicate window); aggregator workers share one durable pull consumer, so adding workers adds
consumers, and a batch a worker took but never acknowledged is redelivered after ``ack_wait``.
The aggregator's ingestion is idempotent by batch id, so a redelivered batch is counted once.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Final

from deniable.core.errors import ConfigurationError

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js.client import JetStreamContext

STREAM: Final = "DENIABLE_BATCHES"
SUBJECT: Final = "deniable.batches"
CONSUMER: Final = "aggregators"
DUPLICATE_WINDOW_S: Final = 3600.0
DEFAULT_ACK_WAIT_S: Final = 60.0
"""A worker that holds a batch this long without acknowledging it is presumed dead."""


def tls_context(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    """Mutual TLS towards the broker: our certificate, and only brokers certified by ``ca``."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    return context


async def connect(url: str, tls: ssl.SSLContext | None, insecure: bool) -> tuple[Client, JetStreamContext]:
    """Connect and make sure the stream exists; ConfigurationError (one line) if that fails."""
    try:
        import nats
        from nats.js.api import RetentionPolicy, StorageType, StreamConfig
    except ImportError as exc:
        raise ConfigurationError("NATS needs the nats extra: pip install 'deniable[nats]'") from exc
    if tls is None and not insecure:
        raise ConfigurationError("NATS without TLS needs --insecure by name")
    try:
        client = await nats.connect(url, tls=tls, connect_timeout=5, max_reconnect_attempts=-1)
        js = client.jetstream()
        config = StreamConfig(
            name=STREAM,
            subjects=[SUBJECT],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW_S,
        )
        await js.add_stream(config)
    except Exception as exc:  # nats-py raises many unrelated types for one cause
        raise ConfigurationError(f"cannot use NATS at {url}: {type(exc).__name__}: {exc}") from exc
    return client, js
