#!/usr/bin/env bash
# The SDK at the lowest versions pyproject.toml allows (ADR 0017): a venv in build/lowest with every
# runtime floor of the bare install and [server] pinned exactly (grpcio, protobuf, pynacl,
# cryptography, numpy, ...), then the SDK tests: client, packaging, golden vectors, independent
# client, and both crypto backends (PyNaCl at its floor against cryptography, ADR 0039).
# Reuses the pip cache; about a minute when the wheels are cached. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/lowest
rm -rf "$venv"
python3 -m venv "$venv"
# "name>=floor" of the bare dependencies and of [server] become "name==floor".
"$venv/bin/python" - > "$venv/constraints.txt" <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
# scipy is no service's dependency (ADR 0036) but tests/core/test_backoff.py's reference: its [dev] floor.
scipy = [r for r in project["optional-dependencies"]["dev"] if r.startswith("scipy")]
for requirement in project["dependencies"] + project["optional-dependencies"]["server"] + scipy:
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([^,\s]+).*", requirement)
    if match:
        print(f"{match[1]}=={match[2]}")
PY
echo "== lowest allowed versions"; cat "$venv/constraints.txt"
"$venv/bin/python" -m pip install -q -c "$venv/constraints.txt" -e ".[server]" scipy \
  "pytest>=8" "pytest-asyncio>=1.0" "pytest-timeout>=2.3" "import-linter>=2.17"  # test tools, not floors
"$venv/bin/python" -m pip check
"$venv/bin/python" - <<'PY'
from importlib.metadata import version
for name in ("grpcio", "protobuf", "pynacl", "cryptography", "numpy"):
    print(f"installed {name} {version(name)}")
PY
"$venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/client/test_reporter.py tests/client/test_outbox.py tests/client/test_budget.py \
  tests/client/test_backoff.py tests/core/test_backoff.py tests/client/test_grpc_transport.py tests/client/test_sync_and_fetch.py \
  tests/client/test_package.py tests/core/test_wire.py tests/core/test_crypto.py \
  tests/test_wire_vectors.py tests/core/test_crypto_backends.py tests/sdk \
  --deselect tests/sdk/test_bare_install.py::test_the_wheel_without_extras_installs_no_server_package_and_sends \
  "$@"  # the wheel test builds and installs a wheel of its own: run by the main suite
