"""Errors the shuffler's handlers raise; the servicer maps each to one gRPC status."""


class ShufflerError(Exception):
    """Base of the handler errors; the message is safe to send to the caller."""


class InvalidRequest(ShufflerError):
    """The request as a whole is malformed (empty, too many reports): INVALID_ARGUMENT."""


class NotFound(ShufflerError):
    """The named campaign does not exist: NOT_FOUND."""


class Unavailable(ShufflerError):
    """The upstream aggregator is needed and unreachable: UNAVAILABLE, the caller retries."""
