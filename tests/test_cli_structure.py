"""The thin CLI's shape (ADR 0025): one registry, no command importing ``main``, admin without the CLI.

Short functions: tests/test_function_length.py, over every product package.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from types import ModuleType
from typing import cast

import pytest

from deniable.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def _sources() -> list[Path]:
    return sorted([*(ROOT / "cli").glob("*.py"), *(ROOT / "admin").glob("*.py")])


@pytest.mark.parametrize(
    "path", [p for p in _sources() if p.name != "__main__.py"], ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_nothing_imports_main(path: Path) -> None:
    """Shared helpers live in cli/options.py and cli/output.py, not in the entry point."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.module != "deniable.cli.main", path.name
            assert not (node.module == "deniable.cli" and any(a.name == "main" for a in node.names))


def test_every_command_module_is_registered() -> None:
    """Each ``cli/cmd_*.py`` is in ``COMMANDS`` and every leaf subcommand has a handler."""
    on_disk = {p.stem for p in (ROOT / "cli").glob("cmd_*.py")}
    assert {cast(ModuleType, m).__name__.rpartition(".")[2] for m in cli_main.COMMANDS} == on_disk
    parser = cli_main.build_parser()
    from deniable.cli import config

    leaves = [p for p in config._parsers(parser) if not any(a.nargs == argparse.PARSER for a in p._actions)]
    assert leaves
    for leaf in leaves:
        assert leaf.get_default("handler") is not None, leaf.prog


def test_admin_does_not_depend_on_the_cli() -> None:
    """``deniable.admin`` is a library: usable without argparse or the command modules."""
    for path in (ROOT / "admin").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("deniable.cli"), path.name
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
                assert "argparse" not in names and not any(n.startswith("deniable.cli") for n in names)
