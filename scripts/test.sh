#!/usr/bin/env bash
# The whole test suite, from a fresh clone: install the Debian packages the tests need
# (scripts/system-deps.sh: mosquitto, postgresql), make/use .venv, install the project and its
# dev tools, run the static checks (ruff, mypy --strict, import contracts, proto drift), then pytest
# (which prints the 20 slowest tests: --durations=20 in pyproject addopts).
# Extra arguments go to pytest (e.g. `scripts/test.sh -m slow` for the long statistical runs).
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
scripts/check.sh
python -m pytest "$@"
