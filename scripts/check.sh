#!/usr/bin/env bash
# Static checks: ruff, mypy --strict over a path view of the deniable namespace, proto drift.
# mypy cannot follow the editable install's import hook, so build/typecheck/deniable holds
# symlinks to the top-level folders, mirroring the package-dir mapping in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
view=build/typecheck
rm -rf "$view" && mkdir -p "$view/deniable"
for pkg in core client shuffler aggregator cli admin sim; do ln -s "../../../$pkg" "$view/deniable/$pkg"; done
ln -s ../../../proto/deniable/v1 "$view/deniable/v1"
echo "== ruff"
ruff check .
echo "== mypy --strict"
MYPYPATH="$view" mypy --strict -p deniable.core -p deniable.client -p deniable.shuffler -p deniable.aggregator -p deniable.cli -p deniable.admin -p deniable.sim
echo "== proto stubs"
scripts/gen_proto.sh --check
echo "static checks passed"
