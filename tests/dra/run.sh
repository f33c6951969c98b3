#!/usr/bin/env bash
# Dynamic Resource Allocation with real parts: builds the DRA harness (tests/dra/harness: kube-apiserver and
# the kubelet's own DRA manager and plugin manager from the k8s.io/kubernetes release the conformance harness
# pins, etcd's server at the version that release requires, the scheduler's allocator) and the CDI reference
# library's checker (tests/cdi/checker), then runs every scenario of tests/dra against the real stack in DRA
# mode on simulated nodes.
#
#   bash tests/dra/run.sh [PYTEST_ARGS...]    # in the project's virtual environment
#
# Needs Go (modules come through the Go module proxy; Go's build cache, shared with the conformance
# harness's build of the same release, makes later builds fast). No root: the kubelet's plugin manager
# watches a plugins_registry dir of each scenario's own, and everything listens on loopback.
# Environment: PYTHON=... interpreter with the project and its test extras installed (default: python).
#
# Ends with "N passed, M failed" and exits 0 only when every scenario passed; a missing
# prerequisite is one line on stderr and exit 2.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python}

die() { echo "tests/dra/run.sh: $*" >&2; exit 2; }

command -v go >/dev/null 2>&1 \
  || die "Go is not installed; the DRA harness (k8s.io/kubernetes, etcd) needs Go to build"
"$PYTHON" -c 'import pytest, simulator, yaml' 2>/dev/null \
  || die "$PYTHON lacks the project or its test extras; install them first: pip install '.[test]'"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rbln-dra.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT" || die "cannot enter $ROOT"

"$PYTHON" tests/conformance/pin_kubelet.py --check --harness "$HERE/harness" \
  || die "harness/go.mod does not match its pinned release (see above)"
RELEASE=$(cd "$HERE/harness" && go list -m -f '{{.Version}}' k8s.io/kubernetes) \
  || die "cannot read the pinned k8s.io/kubernetes release"
CONFORMANCE=$(cd tests/conformance/harness && go list -m -f '{{.Version}}' k8s.io/kubernetes) \
  || die "cannot read the conformance harness's k8s.io/kubernetes release"
[ "$RELEASE" = "$CONFORMANCE" ] \
  || die "the DRA harness pins k8s.io/kubernetes $RELEASE, the conformance harness $CONFORMANCE: pin one release"
echo "== building the DRA harness (k8s.io/kubernetes $RELEASE, $(go version | cut -d' ' -f3)) and the CDI checker"
START=$(date +%s)
(cd "$HERE/harness" && nice -n 10 go build -buildvcs=false -ldflags='-s -w' -o "$WORK/dra-harness" .) \
  || die "building the DRA harness failed (see above)"
(cd tests/cdi/checker && nice -n 10 go build -buildvcs=false -ldflags='-s -w' -o "$WORK/cdi-checker" .) \
  || die "building the CDI checker failed (see above)"
echo "built in $(($(date +%s) - START)) s"

echo "== scenarios"
DRA_HARNESS="$WORK/dra-harness" CDI_CHECKER="$WORK/cdi-checker" "$PYTHON" -m pytest -c "$HERE/pytest.ini" \
  -p no:cacheprovider --durations=0 --junitxml="$WORK/report.xml" "$@" "$HERE"
PYTEST_STATUS=$?

# Counts from the JUnit report; an error, a skip or a missing report is no pass.
read -r PASSED FAILED < <("$PYTHON" tests/support/junit_counts.py "$WORK/report.xml")
echo "$PASSED passed, $FAILED failed"
[ "$PYTEST_STATUS" = 0 ] && [ "$FAILED" = 0 ] && [ "$PASSED" -gt 0 ]
