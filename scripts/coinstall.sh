#!/usr/bin/env bash
# Deniable resolves next to the latest Flower (flwr): pip's resolver, dry run, against PyPI.
# The wheel of this checkout stands for `deniable`; prints the versions pip would pick.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python -m pip wheel --no-deps --no-build-isolation -q -w "$out" .
python -m pip install --dry-run --ignore-installed --quiet --report "$out/report.json" "$out"/deniable-*.whl flwr
python - "$out/report.json" <<'PY'
import json, sys
picked = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
print("resolves: " + ", ".join(f"{n} {picked[n]}" for n in ("deniable", "flwr", "grpcio", "protobuf", "pynacl", "cryptography")))
PY
