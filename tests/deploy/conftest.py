"""The deploy/ tests' helpers (tests/deploy/common.py), loaded by path: ``tests`` is not importable."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _common() -> ModuleType:
    name = "deniable_tests_deploy_common"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("common.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def dp() -> ModuleType:
    """tests/deploy/common.py: paths, loaders, tool lookup."""
    return _common()


@pytest.fixture(scope="session")
def rendered(dp: ModuleType) -> dict[str, str]:
    """Each overlay rendered once by kustomize."""
    return {overlay: dp.kustomize(overlay) for overlay in dp.OVERLAYS}
