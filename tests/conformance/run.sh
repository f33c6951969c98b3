#!/usr/bin/env bash
# Conformance with the real kubelet: builds the harness (tests/conformance/harness: the kubelet's own
# device manager and topology manager, from the k8s.io/kubernetes release pinned in its go.mod) and
# runs every scenario of tests/conformance against the real stack on simulated nodes.
#
#   bash tests/conformance/run.sh [PYTEST_ARGS...]    # as root, in the project's virtual environment
#
# Needs Go (modules come through the Go module proxy; Go's build cache makes later builds fast) and
# root: each scenario runs in a mount namespace of its own, where /var/lib/kubelet/device-plugins is
# a private tmpfs (private_plugin_dir.sh); nothing outside it is touched.
# Environment: PYTHON=... interpreter with the project and its test extras installed (default: python).
#
# Ends with "N passed, M failed" and exits 0 only when every scenario passed; a missing
# prerequisite is one line on stderr and exit 2.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python}

die() { echo "tests/conformance/run.sh: $*" >&2; exit 2; }

command -v go >/dev/null 2>&1 \
  || die "Go is not installed; the kubelet harness (k8s.io/kubernetes) needs Go to build"
[ "$(id -u)" = 0 ] || die "needs root: each scenario runs in a mount namespace of its own"
for tool in unshare nsenter; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool (util-linux) is not installed"
done
"$PYTHON" -c 'import pytest, simulator' 2>/dev/null \
  || die "$PYTHON lacks the project or pytest; install it first: pip install '.[test]'"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rbln-conformance.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT" || die "cannot enter $ROOT"

"$PYTHON" "$HERE/pin_kubelet.py" --check || die "harness/go.mod does not match its pinned release (see above)"
RELEASE=$(cd "$HERE/harness" && go list -m -f '{{.Version}}' k8s.io/kubernetes) \
  || die "cannot read the pinned k8s.io/kubernetes release"
echo "== building the kubelet harness (k8s.io/kubernetes $RELEASE, $(go version | cut -d' ' -f3))"
START=$(date +%s)
# Without a symbol table and DWARF the link, all a warm build does, takes a third less time.
(cd "$HERE/harness" && go build -buildvcs=false -ldflags='-s -w' -o "$WORK/kubelet-harness" .) \
  || die "building the kubelet harness failed (see above)"
echo "built in $(($(date +%s) - START)) s"

echo "== scenarios"
KUBELET_HARNESS="$WORK/kubelet-harness" "$PYTHON" -m pytest -c "$HERE/pytest.ini" -p no:cacheprovider \
  --durations=0 --junitxml="$WORK/report.xml" "$@" "$HERE"
PYTEST_STATUS=$?

# Counts from the JUnit report; an error, a skip or a missing report is no pass.
read -r PASSED FAILED < <("$PYTHON" tests/support/junit_counts.py "$WORK/report.xml")
echo "$PASSED passed, $FAILED failed"
[ "$PYTEST_STATUS" = 0 ] && [ "$FAILED" = 0 ] && [ "$PASSED" -gt 0 ]
