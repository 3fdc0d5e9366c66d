#!/usr/bin/env bash
# The README's test command on a fresh machine (issue 23 item 5, ADR 0036): builds (once) a test
# image from the local Debian base (deploy/local-base.sh, deploy/test-image/Dockerfile), bundles
# HEAD of this checkout (committed work only, never the working tree or its .venv), and inside a
# fresh container clones it into a directory of mode 0700 owned by root (as root's home and
# `mktemp -d` are) and runs scripts/test.sh there as root. Arguments go to pytest, as with
# scripts/test.sh:
#   scripts/test-in-container.sh                                   # the whole default suite (long)
#   DENIABLE_TS=0 DENIABLE_SKIP_CHECKS=1 scripts/test-in-container.sh tests/deploy/test_container_users.py
# The machine's TLS proxy: its CA bundle is bind-mounted read-only and named by PIP_CERT,
# REQUESTS_CA_BUNDLE, SSL_CERT_FILE and NODE_EXTRA_CA_CERTS; it is never baked into an image.
# Debian 12 has no Node >= 20 (the TypeScript SDK's tests need it) and its kubectl 1.20 is too old
# for tests/deploy: the host's `node`, npm and kubectl are bind-mounted read-only when present
# (DENIABLE_TS=0 skips the TypeScript tests instead). Docker-in-docker is not needed: the
# `containers` marker is outside the default run. Needs root and a running dockerd.
#   DENIABLE_TEST_IMAGE (deniable-test:local), DENIABLE_BASE (deniable-base:bookworm, built if
#   missing), DENIABLE_TEST_REBUILD=1 rebuilds the test image (it is rebuilt anyway when its Dockerfile,
#   scripts/system-deps.sh or the base changed).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "test-in-container.sh: run as root" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "test-in-container.sh: no dockerd answers (scripts/test-containers.sh starts one)" >&2; exit 1; }
image=${DENIABLE_TEST_IMAGE:-deniable-test:local}
if [ -z "${DENIABLE_BASE:-}" ]; then deploy/local-base.sh; DENIABLE_BASE=deniable-base:bookworm; fi
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
# The kept test image is rebuilt when its recipe (Dockerfile, system-deps.sh, the base's id) changed.
recipe=$(cat deploy/test-image/Dockerfile scripts/system-deps.sh <(docker image inspect -f '{{.Id}}' "$DENIABLE_BASE") | sha256sum | cut -c1-16)
kept=$(docker image inspect -f '{{index .Config.Labels "dev.deniable.test.recipe"}}' "$image" 2>/dev/null || true)
if [ "${DENIABLE_TEST_REBUILD:-0}" = 1 ] || [ "$kept" != "$recipe" ]; then
  cp deploy/test-image/Dockerfile scripts/system-deps.sh "$tmp/"
  t0=$(date +%s)
  DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE=$DENIABLE_BASE" --label "dev.deniable.test.recipe=$recipe" \
    -t "$image" "$tmp" >/dev/null
  echo "test-in-container.sh: built $image on $DENIABLE_BASE in $(( $(date +%s) - t0 )) s"
fi
git bundle create -q "$tmp/head.bundle" HEAD
ca=/etc/ssl/certs/ca-certificates.crt
run=(docker run --rm --init -v "$tmp/head.bundle:/in/head.bundle:ro")
if [ -s "$ca" ]; then
  run+=(-v "$ca:/etc/deniable-host-ca.crt:ro")
  for var in PIP_CERT REQUESTS_CA_BUNDLE SSL_CERT_FILE NODE_EXTRA_CA_CERTS; do run+=(-e "$var=/etc/deniable-host-ca.crt"); done
fi
kubectl=$(command -v kubectl || true)
[ -n "$kubectl" ] && run+=(-v "$(readlink -f "$kubectl"):/usr/local/bin/kubectl:ro")
if [ "${DENIABLE_TS:-1}" = 1 ]; then
  node=$(command -v node || true)
  npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm || echo /nonexistent)")")")
  [ -n "$node" ] && [ -d "$npm_dir" ] || { echo "test-in-container.sh: no host node/npm (DENIABLE_TS=0 skips the TypeScript tests)" >&2; exit 1; }
  run+=(-v "$(readlink -f "$node"):/usr/local/bin/node:ro" -v "$npm_dir:/usr/local/lib/node_modules/npm:ro")
else
  run+=(-e DENIABLE_SKIP_TS=1)
fi
[ "${DENIABLE_SKIP_CHECKS:-0}" = 1 ] && run+=(-e DENIABLE_SKIP_CHECKS=1)
# shellcheck disable=SC2016  # expanded inside the container
inner='set -euo pipefail
[ -e /usr/local/lib/node_modules/npm ] && ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm
dir=$(mktemp -d) && chmod 0700 "$dir" && stat -c "checkout under %n: mode %a, owner %U" "$dir"
git -c advice.detachedHead=false clone -q /in/head.bundle "$dir/deniable" && cd "$dir/deniable"
echo "HEAD $(git rev-parse --short HEAD); Python $(python3 -V 2>&1 | cut -d" " -f2); node $(node -v 2>/dev/null || echo none)"
exec scripts/test.sh "$@"'
started=$(date +%s)
status=0
"${run[@]}" "$image" bash -c "$inner" test-in-container "$@" || status=$?
echo "test-in-container.sh: exit $status after $(( $(date +%s) - started )) s"
exit $status
