"""Local randomisers, one module each, reachable through one registry.

``create(name, epsilon0=..., domain_size=..., **params)`` returns a ``LocalRandomiser`` whose
``randomise(value)`` gives exactly the payload bytes that are sealed and sent. Every module in
this package is imported once; each concrete ``LocalRandomiser`` subclass with a ``name`` and a
``proto`` value is registered, so a new mechanism is one new module.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

from deniable.core.mechanisms.base import (
    Estimate,
    LocalRandomiser,
    PayloadOutOfDomain,
    Tally,
)

_SKIP = {"base", "exact"}


def _discover() -> dict[str, type[LocalRandomiser]]:
    """Import every mechanism module and collect the concrete randomisers by name."""
    for module in pkgutil.iter_modules(__path__):
        if module.name not in _SKIP and not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    found: dict[str, type[LocalRandomiser]] = {}
    pending = list(LocalRandomiser.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if inspect.isabstract(cls) or "name" not in vars(cls) or not cls.__module__.startswith(__name__):
            continue
        if cls.name in found and found[cls.name] is not cls:
            raise RuntimeError(f"two mechanisms are called {cls.name!r}")
        found[cls.name] = cls
    return found


_REGISTRY: dict[str, type[LocalRandomiser]] = _discover()
_BY_PROTO: dict[int, str] = {cls.proto: name for name, cls in _REGISTRY.items()}


def names() -> list[str]:
    """Registered mechanism names."""
    return sorted(_REGISTRY)


def summaries() -> dict[str, str]:
    """One line per mechanism, for ``deniable privacy mechanisms``."""
    return {name: _REGISTRY[name].summary for name in names()}


def mechanism_class(name: str) -> type[LocalRandomiser]:
    """The class registered under ``name``; ValueError for an unknown name."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown mechanism {name!r}; known: {', '.join(names())}") from None


def create(name: str, *, epsilon0: float, domain_size: int, **params: Any) -> LocalRandomiser:
    """Build the named randomiser; ValueError for an unknown name or bad parameters."""
    cls = mechanism_class(name)
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
    return mechanism_class(name).proto


__all__ = [
    "Estimate",
    "LocalRandomiser",
    "PayloadOutOfDomain",
    "Tally",
    "create",
    "mechanism_class",
    "name_for_proto",
    "names",
    "proto_for_name",
    "summaries",
]
