#!/usr/bin/env bash
# The container tests (issue 23, ADR 0036), after scripts/test.sh in .ci/run: installs Docker,
# docker-compose and mmdebstrap from Debian if missing, starts dockerd if none answers (and stops
# it again at the end), builds the base (deploy/local-base.sh, unless DENIABLE_BASE names a base
# that can be pulled) and the images (cached by the engine between runs), then runs the tests
# marked `containers` (tests/deploy/test_images.py, tests/deploy/test_compose_stack.py), which
# start and remove their own containers, networks and volumes. Needs root. Nothing talks to any
# host but this one: Docker networks are namespaces here, and no registry is pulled from.
#   scripts/test-containers.sh                 # the short run (~5 min warm on 2 cores)
#   DENIABLE_KILLS=10 scripts/test-containers.sh   # the longer kill test (deploy/README.md)
#   DENIABLE_FRESH=0 scripts/test-containers.sh    # without the short fresh-machine run at the end
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "test-containers.sh: run as root" >&2; exit 1; }
started=$(date +%s)
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
dockerd_pid=
cleanup() {
  rm -f deploy/build-ca/ca-certificates.crt
  if [ -n "$dockerd_pid" ]; then kill "$dockerd_pid" 2>/dev/null || true; wait "$dockerd_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
if ! docker info >/dev/null 2>&1; then
  dockerd >/tmp/test-containers-dockerd.log 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start: /tmp/test-containers-dockerd.log" >&2; exit 1; }
fi
if [ -z "${DENIABLE_BASE:-}" ]; then
  deploy/local-base.sh
  export DENIABLE_BASE=deniable-base:bookworm
fi
# The build stage trusts the machine's CA bundle (a TLS proxy's CA may be in it); never the runtime.
[ -s /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt deploy/build-ca/
export DOCKER_BUILDKIT=0  # Debian's docker has no BuildKit/buildx
build() {  # name target dockerfile context
  local t0; t0=$(date +%s)
  docker build -q --build-arg "BASE=$DENIABLE_BASE" -f "$3" --target "$2" -t "$1" "$4" >/dev/null
  echo "built $1 in $(( $(date +%s) - t0 )) s ($(docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1/1e6}'))"
}
for target in aggregator shuffler cli build; do build "deniable-$target:dev" "$target" deploy/Dockerfile .; done
for service in postgres mosquitto prometheus; do
  build "deniable-$service:local" "$service" deploy/local-services/Dockerfile deploy/local-services
done
export DENIABLE_POSTGRES_IMAGE=${DENIABLE_POSTGRES_IMAGE:-deniable-postgres:local}
export DENIABLE_MOSQUITTO_IMAGE=${DENIABLE_MOSQUITTO_IMAGE:-deniable-mosquitto:local}
export DENIABLE_PROMETHEUS_IMAGE=${DENIABLE_PROMETHEUS_IMAGE:-deniable-prometheus:local}
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || { python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]"; }
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
status=0
python -m pytest -p no:cacheprovider -m containers -s tests/deploy/test_images.py tests/deploy/test_compose_stack.py "$@" || status=$?
# Item 5, short: the tests that once failed only on a fresh machine (uid 10001 and a 0700 checkout,
# floats of another CPU, Debian's Python 3.11.2) run in a fresh container from the local base.
# The whole default suite there is scripts/test-in-container.sh alone (~13 min, deploy/README.md).
if [ "${DENIABLE_FRESH:-1}" = 1 ]; then
  DENIABLE_TS=0 DENIABLE_SKIP_CHECKS=1 scripts/test-in-container.sh -n 0 tests/deploy/test_container_users.py \
    tests/core/accounting/test_stated_epsilons.py tests/aggregator/test_pool_exit.py tests/fault/test_worker_kills.py \
    || status=$?
fi
docker image prune -f >/dev/null  # dangling layers of earlier builds; tagged images stay cached
echo "test-containers.sh: $(( $(date +%s) - started )) s"
exit $status
