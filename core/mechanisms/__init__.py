"""Local randomisers, one module each, reachable through one registry.

``create(name, epsilon0=..., domain_size=..., **params)`` returns a ``LocalRandomiser`` whose
``randomise(value)`` gives exactly the payload bytes that are sealed and sent.
"""

from __future__ import annotations

import inspect
from typing import Any

from deniable.core.mechanisms.base import (
    Estimate,
    LocalRandomiser,
    PayloadOutOfDomain,
    Tally,
)
from deniable.core.mechanisms.direct import BinaryRandomisedResponse, GeneralisedRandomisedResponse
from deniable.v1 import deniable_pb2 as pb

_REGISTRY: dict[str, type[LocalRandomiser]] = {
    BinaryRandomisedResponse.name: BinaryRandomisedResponse,
    GeneralisedRandomisedResponse.name: GeneralisedRandomisedResponse,
}

_BY_PROTO: dict[int, str] = {
    pb.BINARY_RR: BinaryRandomisedResponse.name,
    pb.GRR: GeneralisedRandomisedResponse.name,
}


def names() -> list[str]:
    """Registered mechanism names."""
    return sorted(_REGISTRY)


def summaries() -> dict[str, str]:
    """One line per mechanism, for ``deniable privacy mechanisms``."""
    return {name: _REGISTRY[name].summary for name in names()}


def create(name: str, *, epsilon0: float, domain_size: int, **params: Any) -> LocalRandomiser:
    """Build the named randomiser; ValueError for an unknown name or bad parameters."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown mechanism {name!r}; known: {', '.join(names())}") from None
    try:
        inspect.signature(cls).bind(epsilon0, domain_size, **params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for mechanism {name!r}: {exc}") from None
    return cls(epsilon0, domain_size, **params)


def name_for_proto(mechanism: int) -> str:
    """Registry name for a ``deniable.v1.Mechanism`` value."""
    try:
        return _BY_PROTO[mechanism]
    except KeyError:
        raise ValueError(f"unsupported mechanism enum value {mechanism}") from None


def proto_for_name(name: str) -> int:
    """``deniable.v1.Mechanism`` value for a registry name."""
    for value, registered in _BY_PROTO.items():
        if registered == name:
            return value
    raise ValueError(f"mechanism {name!r} has no wire enum value")


__all__ = [
    "Estimate",
    "LocalRandomiser",
    "PayloadOutOfDomain",
    "Tally",
    "create",
    "name_for_proto",
    "names",
    "proto_for_name",
    "summaries",
]
