"""A plaintext aggregator and shuffler on loopback, the shuffler forwarding to the aggregator.

For end-to-end tests whose subject is not TLS; ``shuffler_options`` are ``ShufflerConfig`` fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deniable.aggregator import AggregatorConfig, RunningAggregator, start_aggregator
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
