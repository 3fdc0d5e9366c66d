"""Dependency direction and randomness rules (ADR 0028).

The dependency rules are import-linter contracts in ``pyproject.toml`` ``[tool.importlinter]``:
this module runs ``lint-imports`` on the real tree (every contract not listed in
``import_contracts_broken.txt`` must be kept, every listed one must still be broken) and on a small
synthetic tree in ``tmp_path`` to show that each contract fails when its rule is broken.

Two rules import-linter cannot express stay hand-written here:
- importing ``a.b.c`` also runs the package ``__init__`` of ``a.b``; grimp records only the
  ``a.b.c`` edge, so the shuffler's reach is also checked on grimp's graph with child → parent edges;
- no production module imports ``random`` or ``numpy.random`` or uses ``np.random``: privacy
  noise and the shuffle come from ``deniable.core.rng`` only (a rule about names used, not imports
  between our modules). Imports inside functions and literal ``importlib.import_module("...")`` /
  ``__import__("...")`` calls count.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import astutil
from support.imports import lint_imports

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
BROKEN_LIST = Path(__file__).with_name("import_contracts_broken.txt")
FOLDERS = {
    "core": "deniable.core",
    "client": "deniable.client",
    "shuffler": "deniable.shuffler",
    "aggregator": "deniable.aggregator",
    "cli": "deniable.cli",
    "admin": "deniable.admin",
    "sim": "deniable.sim",
    "console": "deniable.console",
}
SHUFFLER_FORBIDDEN = (
    "deniable.core.mechanisms",
    "deniable.core.crypto",
    "deniable.core.campaigns",
    "deniable.core.wire",
    "deniable.core.accounting",
)
RANDOM_MODULES = ("random", "numpy.random")
# Modules allowed to use numpy.random for seeded simulation of *true* values (never for noise).
# Empty on purpose: add an entry only with a comment saying why.
RANDOM_ALLOWED: frozenset[str] = frozenset()


# =========================================================================== import-linter contracts


def contract_ids() -> list[str]:
    """Ids of the import-linter contracts, in the order of pyproject.toml."""
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    return [c["id"] for c in config["tool"]["importlinter"]["contracts"]]


def known_broken() -> list[str]:
    """Contract ids listed in import_contracts_broken.txt (``#`` starts a comment)."""
    lines = (line.split("#", 1)[0].strip() for line in BROKEN_LIST.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def test_broken_list_names_real_contracts() -> None:
    assert set(known_broken()) <= set(contract_ids())


def test_every_contract_not_listed_as_broken_is_kept() -> None:
    kept = [c for c in contract_ids() if c not in known_broken()]
    assert kept, "no import-linter contract would run"
    code, out = lint_imports(kept)
    assert code == 0, out


def test_contracts_listed_as_broken_are_still_broken() -> None:
    """The list only shrinks: a repaired contract must leave import_contracts_broken.txt (empty
    since issue 13's refactors landed; kept for the next refactor that needs it)."""
    for contract in known_broken():
        code, out = lint_imports([contract])
        assert code != 0, f"{contract} is kept now: remove it from {BROKEN_LIST.name}\n{out}"


# A minimal tree with every package and module the contracts name; "/" ends a package.
SYNTHETIC_TREE = (
    "core/", "core/rng", "core/helpers", "core/mechanisms/", "core/crypto/", "core/campaigns",
    "core/wire/", "core/amplification/", "core/lazy", "core/accounting/", "core/accounting/a",
    "core/accounting/b", "core/plumbing/",
    "core/plumbing/service", "core/other/", "core/other/leaf", "client/", "shuffler/", "shuffler/spool",
    "shuffler/handlers", "aggregator/", "aggregator/handlers", "aggregator/store", "aggregator/decrypt",
    "aggregator/keys", "aggregator/campaigns", "aggregator/ingest", "aggregator/ingest_plan",
    "aggregator/queries", "aggregator/key_admin", "aggregator/context", "aggregator/store_pipeline",
    "aggregator/store_postgres", "cli/", "admin/", "sim/", "console/", "v1/",
)  # fmt: skip


def write_tree(root: Path, sources: Mapping[str, str]) -> Path:
    """Write the synthetic ``deniable`` tree under ``root`` with ``sources`` (path → code) added."""
    for entry in SYNTHETIC_TREE:
        path = root / "deniable" / (entry + "__init__.py" if entry.endswith("/") else entry + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    for entry, source in sources.items():
        path = root / "deniable" / (entry + "__init__.py" if entry.endswith("/") else entry + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    (root / "pyproject.toml").write_text(PYPROJECT.read_text(encoding="utf-8"), encoding="utf-8")
    return root


def test_synthetic_tree_keeps_every_contract(tmp_path: Path) -> None:
    """Guard against a vacuous mutation test: the clean tree passes and is the one analysed."""
    code, out = lint_imports(contract_ids(), write_tree(tmp_path, {}), pythonpath=tmp_path)
    assert code == 0, out
    assert f"Analyzed {len(SYNTHETIC_TREE)} files" in out, out


VIOLATIONS = [
    ("layers", {"core/helpers": "import deniable.client"}),
    ("layers", {"core/helpers": "from deniable.cli import main"}),
    ("layers", {"client/": "from deniable.sim import demo"}),
    ("layers", {"sim/": "import deniable.cli"}),
    ("layers", {"admin/": "from deniable.sim import demo"}),
    ("layers", {"v1/": "from deniable.core import rng"}),
    ("layers", {"admin/": "import deniable.console"}),
    ("console-over-admin", {"console/": "from deniable.aggregator import queries"}),
    ("console-over-admin", {"console/": "import deniable.shuffler.spool"}),
    ("sides-independent", {"client/": "import deniable.shuffler"}),
    ("sides-independent", {"aggregator/": "from deniable.client import x"}),
    ("sides-independent", {"shuffler/spool": "from ..aggregator import store"}),
    ("shuffler-blind", {"shuffler/spool": "from deniable.core import crypto"}),
    ("shuffler-blind", {"shuffler/spool": "import deniable.core.mechanisms"}),
    ("shuffler-blind", {"shuffler/spool": "from deniable.core.campaigns import layout_for"}),
    ("shuffler-blind", {"shuffler/spool": "from deniable.core.accounting import a"}),
    ("shuffler-blind", {"shuffler/spool": "from ..core.helpers import x",
                        "core/helpers": "from .wire import y"}),
    ("shuffler-blind", {"shuffler/spool": "from deniable.core.amplification import bound"}),
    ("kernel-layers", {"core/mechanisms/": "from deniable.core.accounting import a"}),
    ("kernel-layers", {"core/amplification/": "from deniable.core import mechanisms"}),
    ("kernel-layers", {"core/rng": "from deniable.core.campaigns import layout_for"}),
    ("handlers-without-grpc", {"aggregator/store": "import grpc"}),
    ("handlers-without-grpc", {"shuffler/handlers": "from grpc import StatusCode"}),
    ("kernel-without-plumbing", {"core/rng": "from deniable.core.plumbing import service"}),
    ("kernel-without-plumbing", {"core/mechanisms/": "import deniable.core.plumbing.service"}),
    ("core-acyclic", {"core/mechanisms/": "from deniable.core import accounting",
                      "core/accounting/": "from deniable.core import mechanisms"}),
    ("core-acyclic", {"core/accounting/a": "from deniable.core.mechanisms import m",
                      "core/campaigns": "from deniable.core import accounting",
                      "core/mechanisms/": "def f():\n    from deniable.core import campaigns"}),
    ("core-subpackages-acyclic", {"core/accounting/a": "from . import b",
                                  "core/accounting/b": "from . import a"}),
]  # fmt: skip


@pytest.mark.parametrize(("contract", "sources"), VIOLATIONS)
def test_each_contract_fails_when_broken(tmp_path: Path, contract: str, sources: Mapping[str, str]) -> None:
    code, out = lint_imports([contract], write_tree(tmp_path, sources), pythonpath=tmp_path)
    assert code != 0 and "BROKEN" in out, out


def test_every_contract_has_a_violation_case() -> None:
    assert {contract for contract, _ in VIOLATIONS} == set(contract_ids())


# =========================================================================== parent packages

# grimp (under import-linter) records ``from a.b.c import x`` as an import of ``a.b.c`` only, but
# Python runs ``a/__init__`` and ``a/b/__init__`` first: add those edges, then ask for a chain.
REACH_PROGRAM = """
import json, sys
import grimp
graph = grimp.build_graph(*sys.argv[3].split(","), cache_dir=None)
for module in list(graph.modules):
    if "." in module and module.rsplit(".", 1)[0] in graph.modules:
        graph.add_import(importer=module, imported=module.rsplit(".", 1)[0])
found = []
for target in sys.argv[2].split(","):
    if target in graph.modules:
        chain = graph.find_shortest_chain(importer=sys.argv[1], imported=target, as_packages=True)
        if chain:
            found.append(" -> ".join(chain))
print(json.dumps(found))
"""
ROOT_PACKAGES = ",".join(
    tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]["root_packages"]
)


def shuffler_reach(pythonpath: Path | None = None) -> list[str]:
    """Import chains from the shuffler to a forbidden module, counting parent ``__init__`` runs."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    forbidden = ",".join(SHUFFLER_FORBIDDEN)
    args = [sys.executable, "-c", REACH_PROGRAM, "deniable.shuffler", forbidden, ROOT_PACKAGES]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=True)
    found: list[str] = json.loads(result.stdout)
    return found


def test_shuffler_never_reaches_mechanisms_keys_campaigns_or_plaintexts() -> None:
    assert shuffler_reach() == []


def test_reach_check_sees_parent_package_imports(tmp_path: Path) -> None:
    """Importing deniable.core.other.leaf runs deniable.core.other's __init__."""
    sources = {
        "core/other/": "from deniable.core.campaigns import layout_for",
        "shuffler/spool": "from deniable.core.other.leaf import path",
    }
    found = shuffler_reach(write_tree(tmp_path, sources))
    chain = ["deniable.shuffler.spool", "deniable.core.other.leaf", "deniable.core.other"]
    assert found == [" -> ".join([*chain, "deniable.core.campaigns"])]


def test_reach_check_allows_a_clean_shuffler(tmp_path: Path) -> None:
    sources = {
        "shuffler/spool": "from deniable.core.rng import default_rng\nfrom deniable.core import helpers"
    }
    assert shuffler_reach(write_tree(tmp_path, sources)) == []


# =========================================================================== randomness


@dataclass
class Module:
    name: str
    is_package: bool
    imports: set[str] = field(default_factory=set)
    random_uses: list[str] = field(default_factory=list)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def resolve_from(module: Module, node: ast.ImportFrom) -> str:
    """Absolute base module of a ``from ... import`` (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    if node.level - 1 > len(package):
        raise ValueError(f"{module.name}: relative import beyond the top package")
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def is_literal_import_call(node: ast.AST) -> bool:
    """``__import__("x")`` or ``importlib.import_module("x")`` with a literal name."""
    return (
        isinstance(node, ast.Call)
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "__import__")
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
        )
    )


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
            module.imports.update(f"{base}.{alias.name}" for alias in node.names)
        elif is_literal_import_call(node):
            module.imports.add(node.args[0].value)  # type: ignore[attr-defined]
    module.random_uses += [
        f"imports {i}" for i in module.imports if any(within(i, r) for r in RANDOM_MODULES)
    ]
    module.random_uses += [
        f"uses {node.value.id}.random (line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "random"
        and isinstance(node.value, ast.Name)
        and node.value.id in numpy_names
    ]
    return module


def scan(root: Path = ROOT) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for folder, package in FOLDERS.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")) if base.is_dir() else []:
            relative = path.relative_to(base).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            name = ".".join([package, *parts])
            modules[name] = analyse(name, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    return modules


def random_violations(modules: Mapping[str, Module]) -> list[str]:
    return [
        f"{m.name}: {use}" for m in modules.values() if m.name not in RANDOM_ALLOWED for use in m.random_uses
    ]


@pytest.fixture(scope="module")
def tree() -> dict[str, Module]:
    return scan()


def test_scan_sees_the_core(tree: dict[str, Module]) -> None:
    """Guard against a vacuous pass (wrong root, renamed folders)."""
    for expected in (
        "deniable.core.rng",
        "deniable.core.mechanisms",
        "deniable.core.wire.codec",
        "deniable.sim",
    ):
        assert expected in tree
    assert tree["deniable.core.mechanisms"].is_package


def test_no_production_module_uses_random_or_numpy_random(tree: dict[str, Module]) -> None:
    assert random_violations(tree) == []


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


def test_relative_import_resolution() -> None:
    module = analyse("deniable.shuffler.handlers", "from ..core import campaigns\nfrom . import spool")
    assert "deniable.core.campaigns" in module.imports
    assert "deniable.shuffler.spool" in module.imports
    package = analyse("deniable.shuffler", "from .spool import Spool", is_package=True)
    assert "deniable.shuffler.spool" in package.imports
