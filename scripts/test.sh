#!/usr/bin/env bash
# The whole test suite, from a fresh clone: install the Debian packages the tests need
# (scripts/system-deps.sh: mosquitto, postgresql), make/use .venv, install the project and its
# dev tools, run the static checks (ruff, mypy --strict, import contracts, proto drift), then pytest
# (which prints the 20 slowest tests: --durations=20 in pyproject addopts), then the TypeScript SDK's
# tests (`npm ci && npm test` in client-ts/: golden vectors, distributions, and end-to-end runs that
# start the Python services from this venv and headless Chromium; needs Node >= 20 and npm).
# Extra arguments go to pytest (e.g. `scripts/test.sh -m slow` for the long statistical runs);
# pytest runs on DENIABLE_TEST_WORKERS (default 2) pytest-xdist workers, 0 for one process.
# DENIABLE_SKIP_TS=1 / DENIABLE_SKIP_CHECKS=1 leave out the TypeScript tests / the static checks
# (scripts/test-in-container.sh's short runs; the full run keeps both).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/system-deps.sh
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
python -m pip install -q --disable-pip-version-check -e ".[dev]"
scripts/deploy-tools.sh  # hadolint, check-jsonschema, kubernetes-validate, checkov (tests/deploy)
if [ "${DENIABLE_SKIP_CHECKS:-0}" = 1 ]; then
  echo "scripts/test.sh: DENIABLE_SKIP_CHECKS=1: the static checks (scripts/check.sh) are skipped" >&2
else
  scripts/check.sh
fi
python -m pytest -n "${DENIABLE_TEST_WORKERS:-2}" "$@"  # 2 workers: the 2 cores CI has
if [ "${DENIABLE_SKIP_TS:-0}" = 1 ]; then
  echo "scripts/test.sh: DENIABLE_SKIP_TS=1: the TypeScript SDK's tests (client-ts/) are skipped" >&2
  exit 0
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1 \
  || [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
  echo "scripts/test.sh: the TypeScript SDK's tests (client-ts/) need Node >= 20 and npm on PATH" >&2
  exit 1
fi
(cd client-ts && npm ci --no-audit --no-fund && npm test)
