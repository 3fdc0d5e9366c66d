#!/usr/bin/env bash
# Regenerate the committed Python stubs from proto/deniable/v1/*.proto.
# With --check: regenerate into a temporary folder and fail if the committed stubs differ.
set -euo pipefail
cd "$(dirname "$0")/.."
# The generator sets the runtime floors of grpcio/protobuf in pyproject.toml (ADR 0017): stubs
# from a newer grpcio-tools would demand newer runtimes than we declare.
GRPCIO_TOOLS=1.63.2
MYPY_PROTOBUF=3.7.0
have=$(python -c 'from importlib.metadata import version as v; print(v("grpcio-tools"), v("mypy-protobuf"))')
if [ "$have" != "$GRPCIO_TOOLS $MYPY_PROTOBUF" ]; then
  echo "gen_proto.sh needs grpcio-tools==$GRPCIO_TOOLS and mypy-protobuf==$MYPY_PROTOBUF (found: $have); pip install -e '.[dev]'" >&2
  exit 2
fi
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
