"""The one error hierarchy of the services: what a handler refuses, and how a service cannot start.

Each refusal names the gRPC status it ends a call with (``status``, a ``grpc.StatusCode`` member
name, so this kernel module needs no grpc import); ``deniable.core.plumbing.service.status_code``
maps it. Messages are safe to return to the caller.
"""

from __future__ import annotations

from typing import ClassVar


class ConfigurationError(Exception):
    """A service cannot start as configured (port taken, unwritable directory, missing key).

    The message is one line that tells the operator what to change.
    """


class RequestRefused(Exception):
    """Base of the refusals a handler raises; the message is safe to send to the caller."""

    status: ClassVar[str] = "FAILED_PRECONDITION"


class InvalidRequest(RequestRefused):
    """Malformed or out-of-range request fields (empty, too many reports): INVALID_ARGUMENT."""

    status = "INVALID_ARGUMENT"


class NotFound(RequestRefused):
    """The named campaign (or batch) does not exist: NOT_FOUND."""

    status = "NOT_FOUND"


class AlreadyExists(RequestRefused):
    """A campaign id or batch id is already taken: ALREADY_EXISTS."""

    status = "ALREADY_EXISTS"


class FailedPrecondition(RequestRefused):
    """The request does not fit the campaign's state or kind: FAILED_PRECONDITION."""

    status = "FAILED_PRECONDITION"


class Unavailable(RequestRefused):
    """The work cannot be done now (upstream or workers down); the caller retries: UNAVAILABLE."""

    status = "UNAVAILABLE"


class QuotaExceeded(RequestRefused):
    """The source is over its quota for a campaign: RESOURCE_EXHAUSTED, nothing of it kept."""

    status = "RESOURCE_EXHAUSTED"
