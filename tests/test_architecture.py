"""Dependency direction and randomness rules, checked on the source with ``ast``.

- ``core`` imports none of ``deniable.client``, ``.shuffler``, ``.aggregator``, ``.cli``;
- ``client``, ``shuffler``, ``aggregator`` never import each other nor ``deniable.cli``;
- the shuffler never reaches ``deniable.core.mechanisms``, ``.crypto``, ``.campaigns`` or
  ``.wire``, directly or through the core modules it imports (importing ``a.b.c`` also runs the
  package ``__init__`` of ``a.b``, so parents count too);
- no production module imports ``random`` or ``numpy.random`` or uses ``np.random``: privacy
  noise and the shuffle come from ``deniable.core.rng`` only.

Works on whatever files exist: the service folders may be nearly empty while being written.
Imports inside functions and under ``if TYPE_CHECKING`` count, as do literal
``importlib.import_module("...")`` / ``__import__("...")`` calls.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import astutil

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "core": "deniable.core",
    "client": "deniable.client",
    "shuffler": "deniable.shuffler",
    "aggregator": "deniable.aggregator",
    "cli": "deniable.cli",
}
SERVICES = ("deniable.client", "deniable.shuffler", "deniable.aggregator")
SHUFFLER_FORBIDDEN = (
    "deniable.core.mechanisms",
    "deniable.core.crypto",
    "deniable.core.campaigns",
    "deniable.core.wire",
)
RANDOM_MODULES = ("random", "numpy.random")
# Modules allowed to use numpy.random for seeded simulation of *true* values (never for noise).
# Empty on purpose: add an entry only with a comment saying why.
RANDOM_ALLOWED: frozenset[str] = frozenset()


@dataclass
class Module:
    name: str
    is_package: bool
    imports: set[str] = field(default_factory=set)
    random_uses: list[str] = field(default_factory=list)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def resolve_from(module: Module, node: ast.ImportFrom) -> str:
    """Absolute base module of a ``from ... import`` (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    if node.level - 1 > len(package):
        raise ValueError(f"{module.name}: relative import beyond the top package")
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def analyse(name: str, source: str, is_package: bool = False) -> Module:
    """Imported module names (with candidate submodules) and uses of random/numpy.random."""
    module = Module(name, is_package)
    tree = astutil.parse(source, name)
    numpy_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module.imports.add(alias.name)
                if alias.name == "numpy" or (alias.name.startswith("numpy.") and alias.asname is None):
                    numpy_names.add(alias.asname or "numpy")
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(module, node)
            module.imports.add(base)
            for alias in node.names:
                module.imports.add(f"{base}.{alias.name}")
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            module.imports.add(node.args[0].value)
    for imported in module.imports:
        if any(within(imported, r) for r in RANDOM_MODULES):
            module.random_uses.append(f"imports {imported}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "random"
            and isinstance(node.value, ast.Name)
            and node.value.id in numpy_names
        ):
            module.random_uses.append(f"uses {node.value.id}.random (line {node.lineno})")
    return module


def scan(root: Path = ROOT) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for folder, package in FOLDERS.items():
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(base).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            name = ".".join([package, *parts])
            modules[name] = analyse(name, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    return modules


def reachable(modules: Mapping[str, Module], start: Iterable[str]) -> dict[str, str | None]:
    """Every known module reachable from ``start`` (following imports and parent packages),
    mapped to the module that first imported it, to print a chain."""
    came_from: dict[str, str | None] = {}
    queue: deque[str] = deque()
    for name in start:
        came_from[name] = None
        queue.append(name)
    while queue:
        current = queue.popleft()
        for imported in sorted(modules[current].imports):
            for target in [*parents(imported), imported]:
                if target in modules and target not in came_from:
                    came_from[target] = current
                    queue.append(target)
    return came_from


def chain(came_from: Mapping[str, str | None], end: str) -> str:
    steps = [end]
    while (previous := came_from[steps[-1]]) is not None:
        steps.append(previous)
    return " -> ".join(reversed(steps))


def direct_violations(modules: Mapping[str, Module], owner: str, banned: Iterable[str]) -> list[str]:
    banned = tuple(banned)
    return [
        f"{m.name} imports {imported}"
        for m in modules.values()
        if within(m.name, owner)
        for imported in sorted(m.imports)
        if any(within(imported, b) for b in banned)
    ]


def shuffler_violations(modules: Mapping[str, Module]) -> list[str]:
    start = [name for name in modules if within(name, "deniable.shuffler")]
    came_from = reachable(modules, start)
    found = []
    for name, module in modules.items():
        if name not in came_from:
            continue
        for imported in module.imports:  # also names not scanned as files (e.g. a missing module)
            if any(within(imported, b) for b in SHUFFLER_FORBIDDEN):
                found.append(f"{chain(came_from, name)} -> {imported}")
    return sorted(set(found))


def random_violations(modules: Mapping[str, Module]) -> list[str]:
    return [
        f"{m.name}: {use}" for m in modules.values() if m.name not in RANDOM_ALLOWED for use in m.random_uses
    ]


# =========================================================================== the real tree


@pytest.fixture(scope="module")
def tree() -> dict[str, Module]:
    return scan()


def test_scan_sees_the_core(tree: dict[str, Module]) -> None:
    """Guard against a vacuous pass (wrong root, renamed folders)."""
    for expected in ("deniable.core.rng", "deniable.core.mechanisms", "deniable.core.wire.codec"):
        assert expected in tree
    assert tree["deniable.core.mechanisms"].is_package


def test_core_imports_no_service(tree: dict[str, Module]) -> None:
    banned = [*SERVICES, "deniable.cli"]
    assert direct_violations(tree, "deniable.core", banned) == []


@pytest.mark.parametrize("service", SERVICES)
def test_services_do_not_import_each_other_or_the_cli(tree: dict[str, Module], service: str) -> None:
    banned = [s for s in SERVICES if s != service] + ["deniable.cli"]
    assert direct_violations(tree, service, banned) == []


def test_shuffler_never_reaches_mechanisms_keys_campaigns_or_plaintexts(tree: dict[str, Module]) -> None:
    assert shuffler_violations(tree) == []


def test_no_production_module_uses_random_or_numpy_random(tree: dict[str, Module]) -> None:
    assert random_violations(tree) == []


# =========================================================================== the checker itself


def modules_from(sources: Mapping[str, str]) -> dict[str, Module]:
    """Synthetic tree: names ending in ``/`` are packages (``__init__``)."""
    return {n.rstrip("/"): analyse(n.rstrip("/"), s, n.endswith("/")) for n, s in sources.items()}


@pytest.mark.parametrize(
    "source",
    [
        "import random",
        "import random as r",
        "from random import randint",
        "import numpy.random",
        "import numpy.random as npr",
        "from numpy.random import default_rng",
        "from numpy import random",
        "import numpy as np\nrng = np.random.default_rng(1)",
        "import numpy\nnumpy.random.seed(1)",
        "def f():\n    import random\n    return random.random()",
        "import importlib\nimportlib.import_module('numpy.random')",
    ],
)
def test_checker_flags_random_use(source: str) -> None:
    assert random_violations(modules_from({"deniable.client.x": source})) != []


@pytest.mark.parametrize(
    "source",
    [
        "import numpy as np\nx = np.asarray([1])",
        "from deniable.core.rng import default_rng\nx = default_rng().randbelow(3)",
        "import secrets\nclass A:\n    def random(self) -> int:\n        return 4\nA().random()",
        "import numpy.typing as npt",
        "from deniable.core import rng as random_source",
    ],
)
def test_checker_accepts_clean_sources(source: str) -> None:
    assert random_violations(modules_from({"deniable.client.x": source})) == []


def test_checker_follows_core_imports_transitively() -> None:
    tree = modules_from(
        {
            "deniable.core/": "",
            "deniable.core.batches": "import hashlib",
            "deniable.core.helpers": "from deniable.core import batches\nfrom .wire import codec",
            "deniable.core.wire/": "from deniable.core.wire.codec import encode",
            "deniable.core.wire.codec": "import struct",
            "deniable.shuffler/": "",
            "deniable.shuffler.handlers": "from ..core.helpers import thing",
        }
    )
    found = shuffler_violations(tree)
    assert found
    assert any("deniable.shuffler.handlers -> deniable.core.helpers" in f for f in found)


def test_checker_sees_parent_package_imports() -> None:
    """Importing deniable.core.crypto.envelope runs deniable.core.crypto's __init__."""
    tree = modules_from(
        {
            "deniable.core.other/": "from deniable.core.campaigns import layout_for",
            "deniable.core.other.leaf": "import os",
            "deniable.shuffler.spool": "from deniable.core.other.leaf import path",
        }
    )
    assert shuffler_violations(tree) != []


def test_checker_allows_clean_shuffler_and_flags_direct_imports() -> None:
    clean = modules_from(
        {
            "deniable.core.rng": "import os",
            "deniable.core.batches": "import hashlib",
            "deniable.shuffler.batcher": (
                "from deniable.core.rng import default_rng\nfrom deniable.core import batches"
            ),
            "deniable.shuffler.store": "from deniable.v1 import deniable_pb2",
        }
    )
    assert shuffler_violations(clean) == []
    for bad in (
        "from deniable.core import crypto",
        "import deniable.core.mechanisms.direct",
        "from deniable.core.campaigns import layout_for",
        "from deniable.core.wire import decode",
    ):
        assert shuffler_violations(modules_from({"deniable.shuffler.x": bad})) != [], bad


def test_checker_flags_cross_service_and_core_imports() -> None:
    tree = modules_from(
        {
            "deniable.core.x": "from deniable.aggregator import store",
            "deniable.client.y": "import deniable.shuffler.handlers",
            "deniable.aggregator.z": "from deniable.cli import main",
            "deniable.shuffler/": "from . import handlers",
        }
    )
    assert direct_violations(tree, "deniable.core", [*SERVICES, "deniable.cli"]) != []
    assert direct_violations(tree, "deniable.client", ["deniable.shuffler"]) != []
    assert direct_violations(tree, "deniable.aggregator", ["deniable.cli"]) != []
    assert direct_violations(tree, "deniable.shuffler", ["deniable.client", "deniable.aggregator"]) == []


def test_relative_import_resolution() -> None:
    module = analyse("deniable.shuffler.handlers", "from ..core import campaigns\nfrom . import spool")
    assert "deniable.core.campaigns" in module.imports
    assert "deniable.shuffler.spool" in module.imports
    package = analyse("deniable.shuffler", "from .spool import Spool", is_package=True)
    assert "deniable.shuffler.spool" in package.imports
