"""An aggregator and a shuffler on loopback, the shuffler forwarding to the aggregator: plaintext
(for end-to-end tests whose subject is not TLS) or TLS with development certificates.
``shuffler_options`` are ``ShufflerConfig`` fields.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from deniable.aggregator import AggregatorConfig, RunningAggregator, start_aggregator
from deniable.core.plumbing.certs import DevCerts
from deniable.core.plumbing.tls import ServerTls
from deniable.shuffler import RunningShuffler, ShufflerConfig, start_shuffler


async def start_insecure_pair(
    tmp_path: Path, **shuffler_options: Any
) -> tuple[RunningAggregator, RunningShuffler]:
    """Start the aggregator (data in tmp_path/agg), then a shuffler (tmp_path/shuf) in front of it."""
    aggregator = await start_aggregator(
        AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0")
    )
    shuffler = await start_shuffler(
        ShufflerConfig(
            insecure=True,
            data_dir=tmp_path / "shuf",
            upstream=aggregator.address,
            listen="127.0.0.1:0",
            **shuffler_options,
        )
    )
    return aggregator, shuffler


@asynccontextmanager
async def tls_pair(
    tmp_path: Path,
    certs: DevCerts,
    *,
    grace: float = 5.0,
    aggregator_options: Mapping[str, Any] | None = None,
    **shuffler_options: Any,
) -> AsyncIterator[tuple[RunningAggregator, RunningShuffler]]:
    """Aggregator (tmp_path/agg) and shuffler (tmp_path/shuf) serving TLS with ``certs``' role
    certificates (the shuffler trusting only the aggregator's CA upstream); both stopped on exit,
    in-flight RPCs given ``grace`` seconds."""

    def served(role: str) -> ServerTls:
        return certs.server_tls(role)

    aggregator = await start_aggregator(
        AggregatorConfig(
            data_dir=tmp_path / "agg",
            listen="127.0.0.1:0",
            tls=served("aggregator"),
            **(aggregator_options or {}),
        )
    )
    try:
        shuffler = await start_shuffler(
            ShufflerConfig(
                data_dir=tmp_path / "shuf",
                upstream=aggregator.address,
                listen="127.0.0.1:0",
                tls=served("shuffler"),
                upstream_ca=certs.ca("aggregator"),
                **shuffler_options,
            )
        )
        try:
            yield aggregator, shuffler
        finally:
            await shuffler.stop(grace=grace)
    finally:
        await aggregator.stop(grace=grace)
