#!/usr/bin/env bash
# Build every image docker-compose.yml runs, with or without a container registry.
#
#   deploy/images/build.sh [--bases registry|local|auto]      (default: auto)
#
# registry: the official bases (python:3.11-slim, postgres:15, debian:bookworm-slim) are pulled.
# local:    nothing is pulled. A minimal Debian base is bootstrapped from the host's Debian mirror (debootstrap,
#           then `docker import`), and the Python, PostgreSQL and gateway bases are built on it from Debian's
#           packages — as on an air-gapped host that reaches only Debian and PyPI mirrors. The bootstrapped root
#           file system is cached as a tarball under $LABELDP_IMAGE_CACHE (default /var/cache/labeldp/images), so
#           a warm run imports it instead of bootstrapping again.
# auto:     registry when all three bases can be pulled, else local.
#
# Writes deploy/images.env: the base images chosen (image names only, nothing secret), which docker-compose reads
# with --env-file. Builds use the host's network (--network host) for Debian's and PyPI's mirrors.
# Needs: a running Docker engine (DOCKER_HOST as usual); for local bases, root and debootstrap (installed with apt
# when missing). Prints one line per step with its time.
set -euo pipefail
cd "$(dirname "$0")/../.."

bases=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --bases) bases="$2"; shift 2 ;;
    --bases=*) bases="${1#--bases=}"; shift ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$bases" in registry|local|auto) ;; *) echo "build.sh: --bases is registry, local or auto" >&2; exit 2 ;; esac

SUITE=bookworm
MIRROR=${LABELDP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${LABELDP_IMAGE_CACHE:-/var/cache/labeldp/images}
DEBIAN_LOCAL=labeldp/debian:$SUITE
PYTHON_LOCAL=labeldp/python:3.11-$SUITE
POSTGRES_LOCAL=labeldp/postgres:15-$SUITE
REGISTRY_BASES=(python:3.11-slim postgres:15 debian:bookworm-slim)

step() { local started=$SECONDS; "$@"; echo "  ($((SECONDS - started)) s)"; }
quietly() { "$@" >/dev/null; }
# The docker CLI's notice that its legacy builder is deprecated (Debian's engine has no buildx): noise, dropped.
without_builder_notice() {
  "$@" 2> >(grep -v -E 'DEPRECATED: The legacy builder|Install the buildx|docs.docker.com/go/buildx|^ *$' >&2)
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

pull_registry_bases() {
  local image
  for image in "${REGISTRY_BASES[@]}"; do
    have_image "$image" && continue
    timeout 60 docker pull -q "$image" >/dev/null 2>&1 || return 1
  done
}

bootstrap_debian() {
  # The root file system of a minimal Debian (debootstrap's minbase: essential packages, apt, CA certificates),
  # imported as an image. Cached: bootstrapping takes ~25 s and needs the mirror; importing takes seconds.
  local tarball="$CACHE/debian-$SUITE-minbase.tar"
  if have_image "$DEBIAN_LOCAL"; then echo "base $DEBIAN_LOCAL: present"; return; fi
  if [ ! -s "$tarball" ]; then
    if [ "$(id -u)" -ne 0 ]; then echo "build.sh: bootstrapping a Debian base needs root" >&2; exit 1; fi
    command -v debootstrap >/dev/null 2>&1 || {
      DEBIAN_FRONTEND=noninteractive apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
    local root
    root=$(mktemp -d /tmp/labeldp-debian.XXXXXX)
    echo "base $DEBIAN_LOCAL: debootstrap $SUITE from $MIRROR"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || {
      tail -5 "$root.log" >&2; rm -rf "$root" "$root.log"; exit 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    mkdir -p "$CACHE"
    tar --numeric-owner -C "$root" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$root" "$root.log"
  fi
  echo "base $DEBIAN_LOCAL: docker import $tarball"
  docker import -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["bash"]' "$tarball" "$DEBIAN_LOCAL" >/dev/null
}

build_local_bases() {
  step bootstrap_debian
  echo "base $PYTHON_LOCAL: Debian's python3 in a virtual environment"
  step without_builder_notice quietly docker build -q --network host --build-arg DEBIAN_IMAGE="$DEBIAN_LOCAL" -t "$PYTHON_LOCAL" \
    -f deploy/images/python.Dockerfile deploy/images
  echo "base $POSTGRES_LOCAL: Debian's postgresql-15 with the official image's entrypoint contract"
  step without_builder_notice quietly docker build -q --network host --build-arg DEBIAN_IMAGE="$DEBIAN_LOCAL" -t "$POSTGRES_LOCAL" \
    -f deploy/images/postgres.Dockerfile deploy/images
}

if [ "$bases" != local ] && pull_registry_bases; then
  echo "bases: from the registry (${REGISTRY_BASES[*]})"
  printf 'BASE_IMAGE=python:3.11-slim\nPOSTGRES_IMAGE=postgres:15\nDEBIAN_IMAGE=debian:bookworm-slim\n' \
    >deploy/images.env
elif [ "$bases" = registry ]; then
  echo "build.sh: the registry's bases cannot be pulled (try --bases local)" >&2; exit 1
else
  echo "bases: built locally from Debian packages (no registry)"
  build_local_bases
  printf 'BASE_IMAGE=%s\nPOSTGRES_IMAGE=%s\nDEBIAN_IMAGE=%s\n' "$PYTHON_LOCAL" "$POSTGRES_LOCAL" "$DEBIAN_LOCAL" \
    >deploy/images.env
fi

add_site_cas() {
  # The CAs this host trusts beyond Debian's (a site's TLS proxy or mirror), on top of the Python base.
  local base certificates context
  base=$(sed -n 's/^BASE_IMAGE=//p' deploy/images.env)
  certificates=(/usr/local/share/ca-certificates/*.crt)
  [ -e "${certificates[0]}" ] || return 0
  context=$(mktemp -d)
  cp "${certificates[@]}" "$context/"
  echo "base labeldp/site-python: $base with this host's ${#certificates[@]} local CA certificate(s)"
  step without_builder_notice quietly docker build -q --build-arg BASE_IMAGE="$base" -t labeldp/site-python:latest \
    -f deploy/images/site-ca.Dockerfile "$context"
  rm -rf "$context"
  sed -i 's|^BASE_IMAGE=.*|BASE_IMAGE=labeldp/site-python:latest|' deploy/images.env
}
add_site_cas

echo "party images: docker-compose build (labels and features, each with Spark; gateway)"
step without_builder_notice docker-compose --env-file deploy/images.env --profile spark build -q
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^labeldp/' | sort
