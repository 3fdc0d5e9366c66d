#!/usr/bin/env bash
# Build a local stand-in for the pinned base image (python:3.11-slim-bookworm) from Debian's own
# packages, for machines where no container registry can be pulled from (ADR 0036). Debian 12's
# python3 is 3.11, as in the official image; the image is a bookworm minbase with python3,
# python3-venv and ca-certificates, documentation and locales left out; /usr is merged by
# mmdebstrap's own hook rather than the usrmerge package, which would pull in all of perl (~50 MB).
#   deploy/local-base.sh              # builds deniable-base:bookworm unless it exists, built by
#                                     # this same script (label dev.deniable.base.recipe)
#   deploy/local-base.sh --force      # rebuild
# Then: docker build --build-arg BASE=deniable-base:bookworm ... (scripts/test-containers.sh does).
# Needs root (mmdebstrap, docker). The image carries labels saying what it was built from; every
# image built on it inherits them and adds its own `dev.deniable.base` label (deploy/Dockerfile).
set -euo pipefail
tag=${DENIABLE_BASE_TAG:-deniable-base:bookworm}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
recipe=$(sha256sum "$0" | cut -c1-16)  # a kept image from an older script is rebuilt
kept=$(docker image inspect -f '{{index .Config.Labels "dev.deniable.base.recipe"}}' "$tag" 2>/dev/null || true)
if [ "${1:-}" != --force ] && [ "$kept" = "$recipe" ]; then
  echo "local-base.sh: $tag exists (use --force to rebuild)"
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "local-base.sh: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
  --aptopt='APT::Install-Recommends "false"' --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*' \
  "$suite" "$tmp/base.tar" "$mirror" "deb $mirror-security $suite-security main" \
  "deb $mirror $suite-updates main" > "$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
python=$(tar -xOf "$tmp/base.tar" ./var/lib/dpkg/status | awk '/^Package: python3$/{p=1} p&&/^Version:/{print $2; exit}')
docker import \
  --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' \
  --change "LABEL dev.deniable.base.kind=local-debian dev.deniable.base.suite=$suite dev.deniable.base.python3=$python dev.deniable.base.mirror=$mirror dev.deniable.base.recipe=$recipe dev.deniable.base.built=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  "$tmp/base.tar" "$tag" >/dev/null
echo "local-base.sh: built $tag (Debian $suite, python3 $python) in $(( $(date +%s) - start )) s;" \
  "$(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
