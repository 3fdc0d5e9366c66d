#!/usr/bin/env bash
# The Secrets deploy/k8s/overlays/dev expects, from deploy/dev-setup.sh's files (run it first).
# Usage: deploy/k8s/dev-secrets.sh [namespace]   (default deniable-dev; creates the namespace)
set -euo pipefail
ns=${1:-deniable-dev}
d=$(cd "$(dirname "$0")/.." && pwd)
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
secret() { kubectl -n "$ns" create secret generic "$@" --dry-run=client -o yaml | kubectl apply -f -; }
secret deniable-aggregator-tls --from-file="$d/certs/aggregator"
secret deniable-shuffler-tls --from-file="$d/certs/shuffler"
secret deniable-shuffler-operator --from-file="$d/certs/shuffler-operator"  # the preStop drain
secret deniable-mqtt-broker-tls --from-file="$d/certs/mosquitto"
# The aggregator's operator credential stays with its operators (certs/aggregator-operator):
# no Secret of this namespace's workloads carries it (ADR 0030).
secret deniable-postgres --from-file=dsn="$d/secrets/aggregator_store_dsn" \
  --from-file=password="$d/secrets/postgres_password"
secret deniable-mqtt --from-file=password="$d/secrets/shuffler_mqtt_password"
secret mosquitto-passwords --from-file=passwords="$d/secrets/mosquitto.passwd"
