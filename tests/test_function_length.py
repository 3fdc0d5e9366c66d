"""No product function longer than 60 lines (``def`` line to last line inclusive), ADR 0028.

A function may be longer only if its docstring has a line starting ``Long:`` that gives the reason.
``function_length_allowlist.txt`` lists the long functions being split while issue 13 is under way;
it can only shrink: a listed function that is short now (or gone) fails the test too.
Product packages are the folders mapped in ``pyproject.toml`` ``[tool.setuptools.package-dir]``
(so a new package is covered when it is installed), without the generated stubs.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import astutil

ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST = Path(__file__).with_name("function_length_allowlist.txt")
LIMIT = 60
GENERATED = "deniable.v1"

Function = ast.FunctionDef | ast.AsyncFunctionDef


def product_folders(root: Path = ROOT) -> list[Path]:
    """The installed product packages' folders, generated stubs excluded."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    return sorted(root / folder for package, folder in mapping.items() if package != GENERATED)


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, Function]]:
    """Every function and method, nested ones too, with its dotted qualified name."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def length(function: Function) -> int:
    """Lines from the ``def`` line (decorators not counted) to the last line, inclusive."""
    return (function.end_lineno or function.lineno) - function.lineno + 1


def says_why_long(function: Function) -> bool:
    docstring = ast.get_docstring(function) or ""
    return any(line.strip().startswith("Long:") for line in docstring.splitlines())


def long_functions(root: Path = ROOT, limit: int = LIMIT) -> dict[str, int]:
    """``path::qualname`` → length of every function over ``limit`` lines without a ``Long:`` reason."""
    found: dict[str, int] = {}
    for folder in product_folders(root):
        for path in sorted(folder.rglob("*.py")):
            if "_pb2" in path.name:
                continue
            tree = astutil.parse(path.read_text(encoding="utf-8"), str(path))
            for name, function in functions(tree):
                if length(function) > limit and not says_why_long(function):
                    found[f"{path.relative_to(root).as_posix()}::{name}"] = length(function)
    return found


def allowlisted() -> set[str]:
    """Entries of the allow-list: the first word of each line, ``#`` starts a comment."""
    lines = (line.split("#", 1)[0].split() for line in ALLOWLIST.read_text(encoding="utf-8").splitlines())
    return {words[0] for words in lines if words}


@pytest.fixture(scope="module")
def offenders() -> dict[str, int]:
    return long_functions()


def test_no_function_over_the_limit_outside_the_allowlist(offenders: dict[str, int]) -> None:
    new = {name: n for name, n in offenders.items() if name not in allowlisted()}
    report = "\n".join(f"{n:4d} lines  {name}" for name, n in sorted(new.items(), key=lambda item: -item[1]))
    assert not new, f"functions over {LIMIT} lines (split them or say 'Long: <reason>'):\n{report}"


def test_allowlist_only_shrinks(offenders: dict[str, int]) -> None:
    stale = sorted(allowlisted() - offenders.keys())
    assert not stale, f"no longer over {LIMIT} lines (or gone): remove from {ALLOWLIST.name}:\n" + "\n".join(
        stale
    )


def test_rule_sees_the_product() -> None:
    """Guard against a vacuous pass: the scan covers the pipeline packages and skips the stubs."""
    names = {folder.name for folder in product_folders()}
    assert {"core", "client", "shuffler", "aggregator", "cli", "sim"} <= names
    assert not any("proto" in folder.parts for folder in product_folders())


def test_rule_counts_def_to_last_line_and_honours_long_reasons(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    source = (
        f"def fits():\n{body}\n\n"
        f"@staticmethod\ndef too_long():\n{body}\n    return x0\n\n"
        f'class A:\n    async def method(self):\n        """Long: one flat table."""\n{body}\n'
        f"    def nested_owner(self):\n        def inner():\n{body.replace('    ', '            ')}\n"
        f"            return 1\n        return inner\n"
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(source, encoding="utf-8")
    (tmp_path / "pkg" / "x_pb2.py").write_text(f"def generated():\n{body}\n    return 1\n", encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"deniable.pkg" = "pkg"\n"deniable.v1" = "proto"\n', encoding="utf-8"
    )
    assert long_functions(tmp_path) == {
        "pkg/mod.py::too_long": 61,  # 60 lines (fits) pass, 61 do not; the decorator is not counted
        "pkg/mod.py::A.nested_owner": 63,  # an outer function counts its inner one's lines too
        "pkg/mod.py::A.nested_owner.inner": 61,
    }
