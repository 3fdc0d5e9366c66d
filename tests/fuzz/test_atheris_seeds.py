"""The atheris harness's checks over its seeds and simple mutations of them (default run), so the
harness cannot rot; the coverage-guided run itself is the documented command in its docstring."""

from __future__ import annotations

import pytest

# tests/ is on the path (pyproject's pythonpath), so the harness imports as part of the namespace
# package ``fuzz``; it imports atheris only when run, so this works without the [fuzz] extra.
from fuzz import atheris_requests as harness


@pytest.mark.parametrize("index", range(len(harness.seeds())))
def test_seed_and_its_truncations_pass_the_checks(index: int) -> None:
    seed = harness.seeds()[index]
    for cut in range(0, len(seed), max(1, len(seed) // 16)):
        harness.check(seed[:cut])
        harness.check(seed[cut:])
