#!/usr/bin/env bash
# The container image, built with the project's Dockerfile and Makefile and run as a node runs it.
#
#   bash deploy/image_test.sh        # as root, inside the project's activated virtual environment
#
# 1. Engine. docker.io is installed when dockerd or its client is missing (a clean CI machine). When
#    no engine answers, dockerd is started in the background with no bridge and no iptables rules
#    (builds use the host network, containers none), and stopped again at the end; an engine that
#    was already running is used and left running.
# 2. Base. No image registry is reachable, so the base is made here: `debootstrap --variant=minbase
#    bookworm` with Debian's python3, python3-venv and python3-pip plus this host's CA bundle (the
#    build reaches PyPI through the host's TLS setup), `docker import`ed under a local name that says
#    what it is, rbln-device-plugin-base:bookworm-<hash of this recipe>, and passed to the build as
#    BASE_IMAGE. It is kept: a later run with the same recipe reuses it.
# 3. Image. `make -f deploy/container/Makefile build` with that base, on the host network (PyPI only).
# 4. Checks. deploy/image_checks/ under pytest starts the image with --network none on a simulated node
#    and a kubelet simulator in bind-mounted directories (see test_image.py there).
# At the end the image test's containers and its image are removed (the build cache and the base
# stay, for the next run) and the dockerd this script started is stopped.
#
# Environment:
#   DOCKER=/usr/bin/docker   the client. docker.io's own: it speaks the engine's API version and builds
#                            with BuildKit built in (DOCKER_BUILDKIT=1). A newer standalone client (such
#                            as a v28 in /usr/local/bin, earlier on PATH here) hands BuildKit builds to a
#                            buildx plugin, which is not installed, and fails.
#   PYTHON=python            interpreter of the activated virtual environment (pytest, the simulator)
#   DEBIAN_MIRROR=...        where debootstrap fetches bookworm (default http://deb.debian.org/debian)
#   KEEP_IMAGE=1             keep the built image (rbln-device-plugin-image-test:<version>) afterwards
#   IMAGE_ARCHIVE=FILE       build only: save the image to FILE (`docker save`, for a runtime without a
#                            registry to import) and end before the checks (tests/cluster/run.sh)

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DOCKER=${DOCKER:-/usr/bin/docker}
PYTHON=${PYTHON:-python}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGE_NAME=rbln-device-plugin-image-test
export DOCKER_BUILDKIT=1
START=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rbln-image-test.XXXXXX")
STARTED_DOCKERD=

say() { echo "== image test ($(( $(date +%s) - START ))s): $*"; }
die() { echo "image_test.sh: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "run as root: it installs packages, starts dockerd and runs debootstrap"
"$PYTHON" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' \
  || die "$PYTHON is not in a virtual environment; activate the project's (pip install '.[test]')"

cleanup() {
  local status=$?
  if [ -n "${IMAGE:-}" ] && "$DOCKER" version >/dev/null 2>&1; then
    # Containers of this run that a failed check left behind (the checks remove their own).
    "$DOCKER" ps --all --quiet --filter "label=rbln-device-plugin-image-test=$$" | xargs -r "$DOCKER" rm --force >/dev/null
    [ "${KEEP_IMAGE:-}" = 1 ] || "$DOCKER" image rm "$IMAGE" >/dev/null 2>&1 || true
  fi
  if [ -n "$STARTED_DOCKERD" ]; then
    kill -TERM "$STARTED_DOCKERD" 2>/dev/null || true
    # dockerd stops its containerd and shims with it; a bounded wait, then it is killed.
    for _ in $(seq 60); do kill -0 "$STARTED_DOCKERD" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$STARTED_DOCKERD" 2>/dev/null || true
    wait "$STARTED_DOCKERD" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT

apt_install() {
  say "installing $* (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- 1. Engine ---------------------------------------------------------------------------------------
if ! [ -x /usr/sbin/dockerd ] || ! [ -x "$DOCKER" ]; then
  apt_install docker.io
fi
if ! "$DOCKER" version >/dev/null 2>&1; then
  say "starting dockerd"
  /usr/sbin/dockerd --bridge=none --iptables=false >"$WORK/dockerd.log" 2>&1 &
  STARTED_DOCKERD=$!
  for _ in $(seq 120); do
    "$DOCKER" version >/dev/null 2>&1 && break
    kill -0 "$STARTED_DOCKERD" 2>/dev/null || { tail -20 "$WORK/dockerd.log" >&2; die "dockerd exited"; }
    sleep 0.5
  done
  "$DOCKER" version >/dev/null 2>&1 || { tail -20 "$WORK/dockerd.log" >&2; die "dockerd did not answer in 60 s"; }
fi
say "engine $("$DOCKER" version --format '{{.Server.Version}}'), client $DOCKER $("$DOCKER" version --format '{{.Client.Version}}')"

# --- 2. Base -----------------------------------------------------------------------------------------
BASE_SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,python3-pip
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

build_base() {
  local rootfs=$1 tag=$2
  [ -x /usr/sbin/debootstrap ] || apt_install debootstrap
  say "debootstrap --variant=minbase $BASE_SUITE with $BASE_PACKAGES"
  /usr/sbin/debootstrap --variant=minbase --include="$BASE_PACKAGES" "$BASE_SUITE" "$rootfs" "$DEBIAN_MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
  install -D -m 0644 "$CA_BUNDLE" "$rootfs$CA_BUNDLE"
  # Debian's pip trusts that bundle; a venv's pip (its own certifi) is told to as well.
  printf '[global]\ncert = %s\n' "$CA_BUNDLE" >"$rootfs/etc/pip.conf"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
  say "docker import as $tag"
  tar --numeric-owner -C "$rootfs" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "debootstrap --variant=minbase $BASE_SUITE + $BASE_PACKAGES + host CA bundle" \
    - "$tag" >/dev/null
}

# The tag names the recipe: change it, or the CA bundle, and the next run builds a new base.
RECIPE_HASH=$( { declare -f build_base; echo "$BASE_SUITE $BASE_PACKAGES"; cat "$CA_BUNDLE"; } \
  | sha256sum | cut -c1-12)
BASE_IMAGE=rbln-device-plugin-base:$BASE_SUITE-$RECIPE_HASH
if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  say "base $BASE_IMAGE (kept from an earlier run)"
else
  build_base "$WORK/rootfs" "$BASE_IMAGE"
  rm -rf "$WORK/rootfs"
  # Bases of earlier recipes are of no further use.
  "$DOCKER" image ls --format '{{.Repository}}:{{.Tag}}' "${BASE_IMAGE%%:*}" | grep -vxF "$BASE_IMAGE" \
    | xargs -r "$DOCKER" image rm >/dev/null || true
fi

# --- 3. Image ----------------------------------------------------------------------------------------
VERSION=$(make --no-print-directory -f deploy/container/Makefile print-image IMAGE_NAME="$IMAGE_NAME" | sed 's/.*://')
IMAGE=$IMAGE_NAME:$VERSION
PREVIOUS_IMAGE=$("$DOCKER" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)  # KEEP_IMAGE=1 before
say "make -f deploy/container/Makefile build BASE_IMAGE=$BASE_IMAGE IMAGE_NAME=$IMAGE_NAME"
make --no-print-directory -f deploy/container/Makefile build DOCKER="$DOCKER" BASE_IMAGE="$BASE_IMAGE" \
  IMAGE_NAME="$IMAGE_NAME" PLATFORM="linux/$(dpkg --print-architecture)" \
  BUILD_ARGS="--network=host --progress=plain" >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log" >&2; die "the image build failed"; }
if [ -n "$PREVIOUS_IMAGE" ] && [ "$PREVIOUS_IMAGE" != "$("$DOCKER" image inspect --format '{{.Id}}' "$IMAGE")" ]; then
  "$DOCKER" image rm "$PREVIOUS_IMAGE" >/dev/null 2>&1 || true  # untagged by the new build
fi
say "image $IMAGE: $("$DOCKER" image inspect --format '{{.Size}} bytes, {{len .RootFS.Layers}} layers' "$IMAGE")" \
  "on a base of $("$DOCKER" image inspect --format '{{.Size}} bytes, {{len .RootFS.Layers}} layers' "$BASE_IMAGE");" \
  "$(grep -c '^#[0-9]* CACHED' "$WORK/build.log" || true) build steps from the cache"

if [ -n "${IMAGE_ARCHIVE:-}" ]; then
  "$DOCKER" save --output "$IMAGE_ARCHIVE" "$IMAGE"
  say "saved $IMAGE to $IMAGE_ARCHIVE"
  exit 0
fi

# --- 4. Checks ---------------------------------------------------------------------------------------
say "running the container (deploy/image_checks)"
RBLN_IMAGE_UNDER_TEST=$IMAGE RBLN_IMAGE_BASE=$BASE_IMAGE RBLN_IMAGE_TEST_LABEL=$$ DOCKER=$DOCKER \
  "$PYTHON" -m pytest -p no:cacheprovider -v -s deploy/image_checks
say "done"
