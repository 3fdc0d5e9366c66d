#!/usr/bin/env bash
# Debian packages the test suite needs beyond Python: kubectl (tests/deploy), mosquitto (the MQTT broker the MQTT
# transport tests start) and postgresql (the server binaries the PostgreSQL store tests run
# with initdb/pg_ctl in a temporary directory), nats-server (JetStream, started by the NATS
# tests on a free loopback port) and chromium (client-ts browser tests). Installs only what is missing; needs root or sudo.
set -euo pipefail
need=()
[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null 2>&1 || need+=(mosquitto)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
[ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
# chromium: the operator console's browser test (tests/console) drives it headless through playwright.
[ -x /usr/bin/chromium ] || need+=(chromium)
# kubectl renders deploy/k8s overlays (`kubectl kustomize`, tests/deploy). The machine image ships
# kubectl 1.32 (kustomize v5.5); Debian's kubernetes-client is the fallback, but its kubectl 1.20
# embeds kustomize v2, too old for `labels:`/`patches:`: tests/deploy then fail saying so.
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
# chromium: the TypeScript SDK's browser tests (client-ts/test/browser.test.mjs) drive Debian's
# /usr/bin/chromium headless with playwright-core, which never downloads a browser.
[ -x /usr/bin/chromium ] || need+=(chromium)
# libatomic1: the Python playwright package's bundled node driver links it (a minbase Debian, as
# scripts/test-in-container.sh's fresh machine, lacks it: the console's browser test then fails).
compgen -G "/usr/lib/*/libatomic.so.1" >/dev/null || need+=(libatomic1)
[ ${#need[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${need[*]}" >&2
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "need root or sudo to install: ${need[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
install() { "${sudo[@]}" apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null; }
install || { "${sudo[@]}" apt-get update -q >/dev/null && install; }
