"""Put a logger back as it was: ``configure_logging`` (run by ``deniable`` commands) changes global state."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def preserved_logger(name: str = "deniable") -> Iterator[None]:
    """Restore ``name``'s handlers, level and propagation on exit (``""`` is the root logger)."""
    logger = logging.getLogger(name)
    handlers, level, propagate = logger.handlers[:], logger.level, logger.propagate
    try:
        yield
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
