#!/usr/bin/env bash
# Make a Debian base image without a registry: debootstrap a minimal root file
# system and `docker import` it. For machines that cannot pull from Docker Hub;
# elsewhere the Dockerfile's default base (debian:bookworm-slim) is simpler.
#
#   docker/make-base-image.sh [TAG]       # default TAG: commbench-base:bookworm
#
# Does nothing when TAG exists already (the image stays in the daemon between
# runs, so this is the cache). Needs root, debootstrap and a Debian mirror.
# Environment: COMMBENCH_DEBIAN_SUITE (default bookworm), COMMBENCH_DEBIAN_MIRROR
# (default: the first http(s) mirror in this machine's apt sources, else
# http://deb.debian.org/debian).
set -euo pipefail
TAG=${1:-commbench-base:bookworm}
SUITE=${COMMBENCH_DEBIAN_SUITE:-bookworm}

log() { printf '[base-image] %s\n' "$*" >&2; }

if docker image inspect "$TAG" >/dev/null 2>&1; then
  log "$TAG exists"
  exit 0
fi
command -v debootstrap >/dev/null \
  || { log "debootstrap not found: apt-get install debootstrap (scripts/setup.sh --with-test-deps)"; exit 1; }
[ "$(id -u)" = 0 ] || { log "debootstrap needs root"; exit 1; }

mirror=${COMMBENCH_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' \
             /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
           | awk '{print $2}' | head -n1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi

root=$(mktemp -d /var/tmp/commbench-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
log "debootstrap --variant=minbase $SUITE from $mirror (a few minutes)"
debootstrap --variant=minbase "$SUITE" "$root" "$mirror" > "$root.log" 2>&1 \
  || { tail -n 20 "$root.log" >&2; rm -f "$root.log"; log "debootstrap failed"; exit 1; }
rm -f "$root.log"
# Small like the official slim images: no apt lists, caches, docs or logs.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/var/log/*.log
log "docker import as $TAG"
tar -C "$root" --numeric-owner -c . \
  | docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
      -m "debootstrap --variant=minbase $SUITE $mirror" - "$TAG" >/dev/null
docker image inspect "$TAG" --format '[base-image] {{.RepoTags}} {{.Size}} bytes' >&2
