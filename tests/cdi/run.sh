#!/usr/bin/env bash
# The CDI checks against the reference library: builds tests/cdi/checker (a small Go program on
# tags.cncf.io/container-device-interface, the library containerd and CRI-O link, at the release pinned
# in its go.mod) and runs tests/cdi with it: the stack's CDI verdicts and Allocate annotations for each
# CDI_ANNOTATION setting, and the parser's verdicts on a seeded family of specs, each held to the library.
#
#   bash tests/cdi/run.sh [PYTEST_ARGS...]    # in the project's virtual environment
#
# Needs Go (modules through the Go module proxy; Go's build cache makes later builds fast); no root.
# Environment: PYTHON=... interpreter with the project and its test extras installed (default: python).
# Exits non-zero unless every check passed; a missing prerequisite is one line on stderr and exit 2.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python}

die() { echo "tests/cdi/run.sh: $*" >&2; exit 2; }

command -v go >/dev/null 2>&1 || die "Go is not installed; the CDI checker needs Go to build"
"$PYTHON" -c 'import pytest, simulator' 2>/dev/null \
  || die "$PYTHON lacks the project or pytest; install it first: pip install '.[test]'"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rbln-cdi.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT" || die "cannot enter $ROOT"

RELEASE=$(cd "$HERE/checker" && go list -m -f '{{.Version}}' tags.cncf.io/container-device-interface) \
  || die "cannot read the pinned tags.cncf.io/container-device-interface release"
echo "== building the CDI checker (tags.cncf.io/container-device-interface $RELEASE, $(go version | cut -d' ' -f3))"
START=$(date +%s)
(cd "$HERE/checker" && nice -n 10 go build -buildvcs=false -ldflags='-s -w' -o "$WORK/cdi-checker" .) \
  || die "building the CDI checker failed (see above)"
echo "built in $(($(date +%s) - START)) s"

echo "== checks"
CDI_CHECKER="$WORK/cdi-checker" "$PYTHON" -m pytest -c "$HERE/pytest.ini" -p no:cacheprovider "$@" "$HERE"
