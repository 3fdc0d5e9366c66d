"""The ``kit`` fixture: the randomiser tests' helpers from ``support.stats`` as one object.

Statistics an external auditor would also use are public in ``deniable.core.audit``; test-only
helpers live in ``tests/support/stats.py`` (import them from there; this fixture serves the tests
written against it).
"""

from __future__ import annotations

import pytest
from support.stats import Kit

__all__ = ["Kit", "kit"]


@pytest.fixture
def kit() -> Kit:
    """Randomiser-test plumbing."""
    return Kit()
