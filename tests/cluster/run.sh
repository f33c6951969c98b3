#!/usr/bin/env bash
# The Quick Start on a real one-node cluster, in both modes: the chart and the image as an operator installs
# them, on Kubernetes built from source.
#
#   bash tests/cluster/run.sh [PYTEST_ARGS...]    # as root, in the project's virtual environment
#
# 1. Parts, each built once and kept in a cache keyed by what it is built from (CACHE, default
#    ~/.cache/rbln-cluster): the cluster harness (tests/cluster/harness: etcd, kube-apiserver,
#    kube-controller-manager, kube-scheduler and the kubelet of the release the conformance harness pins, one
#    binary), containerd v2.2.9 (containerd, its runc shim, ctr) through the Go module proxy, a static pause.
#    Debian's runc, containernetworking-plugins and busybox-static (and iproute2, openssl) are installed when
#    missing.
# 2. The image: deploy/image_test.sh builds it with the project's Dockerfile (IMAGE_ARCHIVE: the build
#    alone, saved for containerd); busybox and pause become images of their own.
# 3. The cluster and the scenarios: tests/cluster/namespaces.sh makes a private mount and network namespace
#    (nothing of the host's changes outside the run's temp dir), and pytest runs tests/cluster in it: the
#    session brings the cluster up, each mode's scenarios install the chart as the README says.
# Ends with the timings and "N passed, M failed"; exits 0 only when every scenario passed. A missing
# prerequisite is one line on stderr and exit 2.
# Environment: PYTHON=... (default: python), CACHE=... (default: ~/.cache/rbln-cluster).

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python}
CACHE=${CACHE:-$HOME/.cache/rbln-cluster}
CONTAINERD_VERSION=v2.2.9
START=$(date +%s)

die() { echo "tests/cluster/run.sh: $*" >&2; exit 2; }
say() { echo "== cluster ($(( $(date +%s) - START )) s): $*"; }

[ "$(id -u)" = 0 ] || die "run as root: it makes namespaces, mounts and a kubelet"
command -v go >/dev/null 2>&1 || die "Go is not installed; the cluster harness and containerd need Go to build"
"$PYTHON" -c 'import sys, pytest, simulator, yaml; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null \
  || die "$PYTHON is not the project's virtual environment with its test extras (pip install '.[test]')"
cd "$ROOT" || die "cannot enter $ROOT"

missing=()
command -v runc >/dev/null 2>&1 || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
[ -x /bin/busybox ] || missing+=(busybox-static)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]} (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rbln-cluster.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$WORK"' EXIT

# --- 1. Parts -----------------------------------------------------------------------------------------
"$PYTHON" tests/conformance/pin_kubelet.py --check --harness "$HERE/harness" \
  || die "harness/go.mod does not match its pinned release (see above)"
RELEASE=$(cd "$HERE/harness" && go list -m -f '{{.Version}}' k8s.io/kubernetes) \
  || die "cannot read the pinned k8s.io/kubernetes release"
CONFORMANCE=$(cd tests/conformance/harness && go list -m -f '{{.Version}}' k8s.io/kubernetes) \
  || die "cannot read the conformance harness's k8s.io/kubernetes release"
[ "$RELEASE" = "$CONFORMANCE" ] \
  || die "the cluster harness pins k8s.io/kubernetes $RELEASE, the conformance harness $CONFORMANCE: pin one release"
MINOR=${RELEASE#v1.}
MINOR=${MINOR%%.*}
GO_VERSION=$(go env GOVERSION)

# A part's cache key: what it is built from and the Go that builds it.
key() { { echo "$GO_VERSION"; cat "$@"; } | sha256sum | cut -c1-16; }

HARNESS=$CACHE/cluster-harness-$(key "$HERE"/harness/go.mod "$HERE"/harness/go.sum "$HERE"/harness/*.go)
if [ ! -x "$HARNESS" ]; then
  say "building the cluster harness (k8s.io/kubernetes $RELEASE, $GO_VERSION)"
  mkdir -p "$CACHE"
  (cd "$HERE/harness" && nice -n 10 go build -buildvcs=false -o "$HARNESS.partial" -ldflags="-s -w \
      -X k8s.io/component-base/version.gitVersion=$RELEASE -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$MINOR" .) || die "building the cluster harness failed (see above)"
  mv "$HARNESS.partial" "$HARNESS"
fi
CONTAINERD_BIN=$CACHE/containerd-$CONTAINERD_VERSION-$GO_VERSION
if [ ! -x "$CONTAINERD_BIN/ctr" ]; then
  say "building containerd $CONTAINERD_VERSION"
  mkdir -p "$CONTAINERD_BIN"
  GOBIN=$CONTAINERD_BIN nice -n 10 go install -ldflags='-s -w' \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" || die "building containerd failed (see above)"
fi
PAUSE=$CACHE/pause-$(key "$HERE/pause/main.go")
if [ ! -x "$PAUSE" ]; then
  say "building pause"
  (cd "$HERE/pause" && CGO_ENABLED=0 go build -buildvcs=false -ldflags='-s -w' -o "$PAUSE" main.go) \
    || die "building pause failed (see above)"
fi
say "parts: $HARNESS, $CONTAINERD_BIN, $PAUSE"

# --- 2. Images ----------------------------------------------------------------------------------------
say "building the image (deploy/image_test.sh)"
IMAGE_ARCHIVE=$WORK/image.tar PYTHON=$PYTHON bash deploy/image_test.sh >"$WORK/image.log" 2>&1 \
  || { tail -30 "$WORK/image.log" >&2; die "the image build failed"; }
grep '^== image test' "$WORK/image.log"
"$PYTHON" "$HERE/images.py" --pause "$PAUSE" --busybox /bin/busybox --out "$WORK" \
  || die "cannot make the pause and busybox images"

# --- 3. The cluster and the scenarios -----------------------------------------------------------------
say "scenarios"
export NODE_IP=10.99.0.1 KUBERNETES_SERVICE_IP=10.96.0.1
CLUSTER_WORK=$WORK CLUSTER_HARNESS=$HARNESS CONTAINERD_BIN=$CONTAINERD_BIN \
  IMAGE_ARCHIVES="$WORK/image.tar $WORK/pause.tar $WORK/busybox.tar" \
  unshare --mount --propagation private --net --pid --fork --mount-proc --kill-child \
  bash "$HERE/namespaces.sh" "$WORK" -- \
  "$PYTHON" -m pytest -c "$HERE/pytest.ini" -p no:cacheprovider --junitxml="$WORK/report.xml" "$@" "$HERE"
PYTEST_STATUS=$?

# Counts from the JUnit report; an error, a skip or a missing report is no pass.
read -r PASSED FAILED < <("$PYTHON" tests/support/junit_counts.py "$WORK/report.xml")
say "done"
echo "$PASSED passed, $FAILED failed"
[ "$PYTEST_STATUS" = 0 ] && [ "$FAILED" = 0 ] && [ "$PASSED" -gt 0 ]
