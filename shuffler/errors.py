"""Errors the shuffler's handlers raise; ``status_code`` maps each to one gRPC status."""

from __future__ import annotations

import grpc


class ShufflerError(Exception):
    """Base of the handler errors; the message is safe to send to the caller."""


class InvalidRequest(ShufflerError):
    """The request as a whole is malformed (empty, too many reports): INVALID_ARGUMENT."""


class NotFound(ShufflerError):
    """The named campaign does not exist: NOT_FOUND."""


class Unavailable(ShufflerError):
    """The upstream aggregator is needed and unreachable: UNAVAILABLE, the caller retries."""


class QuotaExceeded(ShufflerError):
    """The source is over its quota for a campaign: RESOURCE_EXHAUSTED, nothing of the request spooled."""


def status_code(error: ShufflerError) -> grpc.StatusCode:
    """The gRPC status a handler error ends a call with (the gRPC and the MQTT face alike)."""
    if isinstance(error, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(error, QuotaExceeded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(error, Unavailable):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL
