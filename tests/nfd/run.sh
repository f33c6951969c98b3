#!/usr/bin/env bash
# Node labels checked with the real Node Feature Discovery: builds nfd-worker and nfd-rules (NFD's
# NodeFeatureRule matcher, tests/nfd/harness) from the sigs.k8s.io/node-feature-discovery release pinned in
# tests/nfd/harness/go.mod, finds NFD's CRDs in Go's module cache, and runs the checks of tests/nfd.
#
#   bash tests/nfd/run.sh [PYTEST_ARGS...]    # as root, in the project's virtual environment
#
# Needs Go (modules come through the Go module proxy; Go's module and build caches make later runs
# fast) and root: nfd-worker reads a directory compiled into it, which each run gets in a mount
# namespace of its own (with_features_dir.sh); nothing outside it is touched.
# Environment: PYTHON=... interpreter with the project and its test extras installed (default: python).
# Exits 0 only when every check passed; a missing prerequisite is one line on stderr and exit 2.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python}

die() { echo "tests/nfd/run.sh: $*" >&2; exit 2; }

command -v go >/dev/null 2>&1 || die "Go is not installed; NFD's programs (sigs.k8s.io/node-feature-discovery) need Go to build"
[ "$(id -u)" = 0 ] || die "needs root: each nfd-worker run gets NFD's feature directory in a mount namespace of its own"
command -v unshare >/dev/null 2>&1 || die "unshare (util-linux) is not installed"
"$PYTHON" -c 'import pytest, simulator, jsonschema' 2>/dev/null \
  || die "$PYTHON lacks the project or its test extras; install them first: pip install '.[test]'"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rbln-nfd.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT" || die "cannot enter $ROOT"

NFD_VERSION=$(cd "$HERE/harness" && go list -m -f '{{.Version}}' sigs.k8s.io/node-feature-discovery) \
  || die "cannot read the pinned sigs.k8s.io/node-feature-discovery release"
echo "== building nfd-worker and nfd-rules (sigs.k8s.io/node-feature-discovery $NFD_VERSION, $(go version | cut -d' ' -f3))"
START=$(date +%s)
LDFLAGS="-s -w -X sigs.k8s.io/node-feature-discovery/pkg/version.version=$NFD_VERSION"
(cd "$HERE/harness" \
  && go build -buildvcs=false -ldflags="$LDFLAGS" -o "$WORK/nfd-worker" sigs.k8s.io/node-feature-discovery/cmd/nfd-worker \
  && go build -buildvcs=false -ldflags="$LDFLAGS" -o "$WORK/nfd-rules" .) \
  || die "building NFD's programs failed (see above)"
echo "built in $(($(date +%s) - START)) s"
NFD_CRDS=$(sh "$HERE/crds.sh") || die "cannot find NFD's CRDs in the module cache (see above)"

echo "== checks"
NFD_WORKER="$WORK/nfd-worker" NFD_RULES="$WORK/nfd-rules" NFD_CRDS="$NFD_CRDS" \
  "$PYTHON" -m pytest -c "$HERE/pytest.ini" -p no:cacheprovider --durations=5 "$@" "$HERE"
