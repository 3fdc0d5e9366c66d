"""The aggregator service: holds the keys, decrypts shuffled batches, keeps counts, answers queries."""

from deniable.aggregator.server import (
    AggregatorConfig,
    RunningAggregator,
    serve_aggregator,
    start_aggregator,
)

__all__ = ["AggregatorConfig", "RunningAggregator", "serve_aggregator", "start_aggregator"]
