#!/usr/bin/env bash
# Certificates and secrets for the dev stack (deploy/compose.yaml), owned by the uid that reads each:
# 10001 (aggregator, shuffler, cli), 1883 (mosquitto), 472 (grafana), root (postgres' entrypoint).
# Run as root once: `sudo deploy/dev-setup.sh` (needs `deniable` from `pip install .` and
# `mosquitto_passwd` from Debian's mosquitto). Writes certs/ and secrets/ beside this script, or
# under $1. Never overwrites: delete certs/ and secrets/ to start again. Device broker password:
# secrets/device_mqtt_password.
set -euo pipefail
out=${1:-$(cd "$(dirname "$0")" && pwd)}
deniable=${DENIABLE:-deniable}
[ "$(id -u)" -eq 0 ] || { echo "dev-setup.sh: run as root (it gives each file to its service's uid)" >&2; exit 1; }
[ -e "$out/certs" ] || [ -e "$out/secrets" ] && { echo "dev-setup.sh: $out/certs or secrets exists; kept" >&2; exit 0; }
umask 077
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
"$deniable" certs dev --out "$tmp" --aggregator-host aggregator --shuffler-host shuffler \
  --mqtt-host mosquitto --mqtt-host localhost >/dev/null
# One directory per holder, each with only its own key and the CAs it needs (ADR 0030): the
# shuffler's directories hold nothing the aggregator accepts beyond the `shuffler` role.
holder() {  # holder DIR OWNER FILE...: the directory of one holder; *.key files 0600
  local dir=$1 owner=$2; shift 2
  install -d -m 0750 -o "$owner" -g "$owner" "$out/certs/$dir"
  for f in "$@"; do
    case $f in *.key) mode=0600 ;; *) mode=0644 ;; esac
    install -m "$mode" -o "$owner" -g "$owner" "$tmp/$f" "$out/certs/$dir/"
  done
}
holder aggregator 10001 aggregator.pem aggregator.key aggregator-clients-ca.pem aggregator-ca.pem
holder aggregator-operator 10001 aggregator-operator.pem aggregator-operator.key aggregator-ca.pem
holder shuffler 10001 shuffler.pem shuffler.key shuffler-clients-ca.pem shuffler-ca.pem aggregator-ca.pem
holder shuffler-operator 10001 shuffler-operator.pem shuffler-operator.key shuffler-ca.pem
holder mosquitto 1883 mqtt-broker.pem mqtt-broker.key
holder devices 0 shuffler-ca.pem  # what apps ship: the shuffler party's CA (gRPC and MQTT)
install -d -m 0755 "$out/secrets"
secret() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
pg=$(secret); shuffler_pw=$(secret); device_pw=$(secret)
put() { printf '%s' "$3" > "$out/secrets/$1"; chown "$2" "$out/secrets/$1"; chmod 0600 "$out/secrets/$1"; }
put postgres_password 0:0 "$pg"
put aggregator_store_dsn 10001:10001 "postgresql://deniable:$pg@postgres:5432/deniable"
put shuffler_mqtt_password 10001:10001 "$shuffler_pw"
put device_mqtt_password 0:0 "$device_pw"
put grafana_admin_password 472:472 "$(secret)"
put mosquitto.passwd 1883:1883 "shuffler:$shuffler_pw
device:$device_pw
"
mosquitto_passwd -U "$out/secrets/mosquitto.passwd"  # hash in place: no plaintext reaches argv
echo "wrote $out/certs/{aggregator,aggregator-operator,shuffler,shuffler-operator,mosquitto,devices} and $out/secrets; now:"
echo "  docker compose -f deploy/compose.yaml up -d --build"
