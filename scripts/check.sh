#!/usr/bin/env bash
# Static checks: ruff, mypy --strict over a path view of the deniable namespace, the import-linter
# contracts, mypy on tests, the duplicate-code check and proto drift (ADR 0028).
# mypy cannot follow the editable install's import hook, so build/typecheck/deniable holds
# symlinks to the top-level folders, mirroring the package-dir mapping in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
PRODUCT=(core client shuffler aggregator cli admin sim console)
view=build/typecheck
rm -rf "$view" && mkdir -p "$view/deniable"
for pkg in "${PRODUCT[@]}"; do ln -s "../../../$pkg" "$view/deniable/$pkg"; done
ln -s ../../../proto/deniable/v1 "$view/deniable/v1"
echo "== ruff"
ruff check .
echo "== mypy --strict"
packages=(); for pkg in "${PRODUCT[@]}"; do packages+=(-p "deniable.$pkg"); done
MYPYPATH="$view" mypy --strict "${packages[@]}"
echo "== mypy --strict bench/ (thin scripts over deniable.sim; bench/throwaway.py reaches tests/support)"
MYPYPATH="$view:bench:tests" mypy --strict bench
echo "== import contracts (lint-imports; known-broken ones in tests/import_contracts_broken.txt skipped)"
contracts=$(python - <<'PY'
import tomllib
ids = [c["id"] for c in tomllib.load(open("pyproject.toml", "rb"))["tool"]["importlinter"]["contracts"]]
broken = {line.split("#")[0].strip() for line in open("tests/import_contracts_broken.txt")} - {""}
print(" ".join(f"--contract {i}" for i in ids if i not in broken))
PY
)
# shellcheck disable=SC2086  # one word per option on purpose
lint-imports --no-cache --no-logo $contracts
# Tests are checked less strictly than the product (fixtures take untyped pytest objects and
# helpers, so untyped defs, calls and decorators are allowed) but every body is checked. With tests/
# on MYPYPATH, tests/<dir>/conftest.py is <dir>.conftest, so same-named files do not collide
# (tests/fault/run.py and soak.py are checked too: they import the harness as support.fault_harness).
echo "== mypy tests/ (check_untyped_defs)"
MYPYPATH="$view:tests" mypy --allow-untyped-defs --allow-incomplete-defs --allow-untyped-calls \
  --allow-untyped-decorators --check-untyped-defs tests
# pylint's similarity checker (R0801) over the product code: 8 or more equal lines, imports,
# docstrings, comments and signatures ignored; generated stubs are outside the product folders.
echo "== duplicate code (pylint R0801)"
pylint --disable=all --enable=duplicate-code --min-similarity-lines=8 --ignore-imports=yes \
  --ignore-docstrings=yes --ignore-comments=yes --ignore-signatures=yes --ignore-patterns='.*_pb2.*' \
  --score=no "${PRODUCT[@]}"
echo "== proto stubs"
scripts/gen_proto.sh --check
echo "static checks passed"
