#!/usr/bin/env bash
# Regenerate the committed Python stubs from proto/deniable/v1/*.proto.
# With --check: regenerate into a temporary folder and fail if the committed stubs differ.
set -euo pipefail
cd "$(dirname "$0")/.."
out=proto
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
python -m grpc_tools.protoc -I proto \
  --python_out="$out" --mypy_out="$out" \
  --grpc_python_out="$out" --mypy_grpc_out="$out" \
  proto/deniable/v1/*.proto
if [ "${1:-}" = "--check" ]; then
  status=0
  for f in "$out"/deniable/v1/*; do
    name=$(basename "$f")
    if ! diff -q "$f" "proto/deniable/v1/$name" >/dev/null 2>&1; then
      echo "generated stub differs from the committed one: proto/deniable/v1/$name (run scripts/gen_proto.sh)" >&2
      status=1
    fi
  done
  exit $status
fi
