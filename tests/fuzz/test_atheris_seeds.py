"""The atheris harness's checks over its seeds and simple mutations of them (default run), so the
harness cannot rot; the coverage-guided run itself is the documented command in its docstring."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "atheris_requests", Path(__file__).with_name("atheris_requests.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("atheris_requests", module)
    spec.loader.exec_module(module)
    return module


HARNESS = _harness()


@pytest.mark.parametrize("index", range(len(HARNESS.seeds())))
def test_seed_and_its_truncations_pass_the_checks(index: int) -> None:
    seed = HARNESS.seeds()[index]
    for cut in range(0, len(seed), max(1, len(seed) // 16)):
        HARNESS.check(seed[:cut])
        HARNESS.check(seed[cut:])
