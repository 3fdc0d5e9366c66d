"""``ast.parse`` for the import-boundary tests, robust to CPython 3.11's sporadic
"AST constructor recursion depth mismatch" SystemError (python/cpython gh-106905, fixed in later
3.11 releases): on that error the file is parsed again in a fresh interpreter."""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys

_PARSE = (
    "import ast, pickle, sys; sys.stdout.buffer.write(pickle.dumps(ast.parse(sys.stdin.read(), sys.argv[1])))"
)


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """The module's AST; a fresh interpreter parses it if this one hits the 3.11 recursion bug."""
    try:
        return ast.parse(source, filename)
    except SystemError:
        out = subprocess.run(
            [sys.executable, "-c", _PARSE, filename], input=source.encode(), capture_output=True, check=True
        ).stdout
        tree: ast.Module = pickle.loads(out)
        return tree
